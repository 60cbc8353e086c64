"""The PaddlePaddle versions the engine supports: 3.3.x, checked when `fastdeploy` is imported.

Besides Paddle's public API the engine relies on two private methods whose behaviour Paddle does not
promise across minor versions:

- `DenseTensor._share_data_with` (`model_executor/host_arrays.py`): a numpy array's memory shared
  into a tensor without the leaking `paddle.Tensor` constructor;
- `Tensor._clear_data` (`model_executor/layers/parameters.py`): a released parameter's memory freed
  while the object is kept for reuse.

It also carries workarounds measured on 3.3 (the constructor's leak above; `import paddle` pinning
its thread pool, `platforms/cpu.py`). So another version is refused at import with an ImportError
naming the installed version and the supported range, rather than failing later, or silently
leaking, in the middle of a run.
"""
import re

SUPPORTED = (3, 3)  # major, minor
SUPPORTED_RANGE = ">=3.3.0,<3.4"
INSTALL = 'pip install "paddlepaddle==3.3.*"'


def check_paddle_version(version: str) -> None:
    """Raise ImportError unless `version` (a `paddle.__version__`, e.g. "3.3.1", "3.3.0rc0") is 3.3.x.
    A source build reporting "0.0.0" (Paddle's develop branch) is refused too: it is not 3.3."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) != SUPPORTED:
        raise ImportError(
            f"fastdeploy supports PaddlePaddle {SUPPORTED_RANGE} (3.3.x), but paddle {version!r} is installed: "
            f"the engine relies on Paddle 3.3's private Tensor._clear_data and DenseTensor._share_data_with. "
            f"Install a supported version: {INSTALL}"
        )


def require_supported_paddle() -> None:
    """Import paddle and check its version (`check_paddle_version`); ImportError naming the install
    command when paddle is missing. Call after `platforms.cpu.prepare_environment()`."""
    try:
        import paddle
    except ModuleNotFoundError as e:
        if e.name != "paddle":  # paddle is there but one of its own dependencies is not
            raise
        raise ImportError(f"fastdeploy needs PaddlePaddle {SUPPORTED_RANGE}, which is not installed: {INSTALL}") from e
    check_paddle_version(paddle.__version__)
