"""A built wheel carries the custom ops' sources (setup.py installs custom_ops/ as fastdeploy/_custom_ops/)
and the installed engine finds them there: in a fresh venv holding only the wheel (paddle, numpy, tqdm, ...
come from this interpreter's package directories, listed in a .pth file; nothing downloaded), from a
directory outside the checkout, `compiled_ops()` is the extension module. The build cache is keyed by the sources' names and bytes, so the installed copy
maps to the checkout's build directory and an existing build is imported, not compiled again."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fastdeploy  # noqa: F401  (before paddle)

from fastdeploy.model_executor.ops import loader

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import json, sys
from pathlib import Path
import fastdeploy
from fastdeploy.model_executor.ops import compiled_ops, loader
ops = compiled_ops()
print(json.dumps({"file": fastdeploy.__file__, "prefix": sys.prefix, "setup_ops": str(loader.SETUP_OPS),
                  "build_directory": str(loader._setup_ops().build_directory()),
                  "compiled": ops is not None, "has_linear": hasattr(ops, "gguf_linear")}))
"""


def _run(command, timeout, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def _copy_checkout(tmp_path):
    """What setup.py packages, copied (an in-tree build would leave build/, stale files included, in the
    checkout), and the environment for pip and the venv: no index, nothing from this process's PYTHONPATH."""
    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "_custom_ops", "build", "*.egg-info")
    shutil.copy2(ROOT / "setup.py", source / "setup.py")
    shutil.copytree(ROOT / "fastdeploy", source / "fastdeploy", ignore=ignore)
    shutil.copytree(ROOT / "custom_ops", source / "custom_ops", ignore=ignore)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "FD_DISABLE_CUSTOM_OPS", "PIP_REQUIRE_VIRTUALENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return source, env


def _package_directories() -> list[str]:
    """This interpreter's package directories, in its sys.path order: a venv's own site-packages (and its
    base's when the venv sees system site-packages), a conda env's, the system's, the user site. Not
    `--system-site-packages`: from inside a venv that gives the *base* interpreter's packages, not the
    venv's. Not PYTHONPATH: the venv must import the package it installed."""
    return [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]


def _make_venv(tmp_path, env) -> Path:
    """A venv without pip or system site-packages that sees this interpreter's package directories after
    its own site-packages (plain directory lines of a .pth file, so the .pth files in them, an editable
    fastdeploy's finder among them, are not run); returns its python."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=60, env=env)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   timeout=60, env=env).stdout.strip()
    (Path(purelib) / "_test_base_packages.pth").write_text("\n".join(_package_directories()) + "\n")
    return python


def test_wheel_carries_the_ops_and_the_installed_loader_finds_them(tmp_path):
    source, env = _copy_checkout(tmp_path)
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(tmp_path / "dist")], timeout=120, cwd=source, env=env)
    (wheel,) = (tmp_path / "dist").glob("fastdeploy-*.whl")

    python = _make_venv(tmp_path, env)
    # this environment's pip, run by the venv's python, installs into the venv
    _run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], timeout=120, env=env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run([str(python), "-c", CHECK], timeout=400, cwd=elsewhere, env=env)
    found = json.loads(result.stdout.strip().splitlines()[-1])

    installed = (tmp_path / "venv").resolve()
    package = Path(found["file"]).resolve().parent
    assert package.is_relative_to(installed), found
    assert Path(found["setup_ops"]) == package / "_custom_ops" / "setup_ops.py", found
    for name in ("cpu_ops/gguf_linear.cc", "cpu_ops/cpu_ops.h", "gpu_ops/sampling_op.cu",
                 "gpu_ops/sampling_kernel.cuh"):
        assert (package / "_custom_ops" / name).read_bytes() == (ROOT / "custom_ops" / name).read_bytes()
    assert found["compiled"] and found["has_linear"], found
    # the installed sources hash like the checkout's: the same cached build serves both
    assert found["build_directory"] == str(loader._setup_ops().build_directory())


def test_editable_install_uses_the_checkout_sources(tmp_path):
    """README's `pip install -e .`: the package stays in the checkout, and so do the op sources it uses."""
    source, env = _copy_checkout(tmp_path)
    python = _make_venv(tmp_path, env)
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-e", "."],
         timeout=120, cwd=source, env=env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run([str(python), "-c", CHECK], timeout=400, cwd=elsewhere, env=env)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve() == (source / "fastdeploy" / "__init__.py").resolve(), found
    assert Path(found["setup_ops"]).resolve() == (source / "custom_ops" / "setup_ops.py").resolve(), found
    assert found["compiled"], found


def test_checkout_finds_its_own_custom_ops():
    """Running from a checkout (or an editable install of it): no fastdeploy/_custom_ops, the checkout's."""
    assert not (ROOT / "fastdeploy" / "_custom_ops").exists()
    assert loader.SETUP_OPS == ROOT / "custom_ops" / "setup_ops.py"
