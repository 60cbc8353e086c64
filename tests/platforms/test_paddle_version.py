"""`import fastdeploy` accepts PaddlePaddle 3.3.x only: another version (mocked here) or no paddle at all is an
ImportError naming the installed version, the supported range and the install command."""
import subprocess
import sys

import paddle
import pytest

from fastdeploy.platforms.paddle_version import SUPPORTED_RANGE, check_paddle_version


@pytest.mark.parametrize("version", ["3.3.0", "3.3.1", "3.3.0rc0", "3.3.2.post112"])
def test_3_3_releases_are_accepted(version):
    check_paddle_version(version)


@pytest.mark.parametrize("version", ["3.2.2", "3.4.0", "3.30.0", "2.6.2", "4.3.0", "0.0.0", "develop"])
def test_other_versions_are_refused_naming_version_and_range(version):
    with pytest.raises(ImportError) as raised:
        check_paddle_version(version)
    message = str(raised.value)
    assert repr(version) in message and SUPPORTED_RANGE in message
    assert "_clear_data" in message and "_share_data_with" in message
    assert 'pip install "paddlepaddle==3.3.*"' in message


def _import_fastdeploy_after(setup: str) -> subprocess.CompletedProcess:
    """`import fastdeploy` in a fresh interpreter after `setup` ran."""
    return subprocess.run([sys.executable, "-c", f"{setup}\nimport fastdeploy"], capture_output=True, text=True,
                          timeout=120)


def test_import_refuses_a_paddle_of_another_version():
    done = _import_fastdeploy_after("import paddle\npaddle.__version__ = '3.4.0'")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastdeploy supports PaddlePaddle >=3.3.0,<3.4"), done.stderr
    assert "'3.4.0' is installed" in last


def test_import_without_paddle_names_the_install_command():
    done = _import_fastdeploy_after("import sys\nsys.modules['paddle'] = None  # as if not installed")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ('ImportError: fastdeploy needs PaddlePaddle >=3.3.0,<3.4, which is not installed: '
                    'pip install "paddlepaddle==3.3.*"'), done.stderr


def test_this_paddle_is_supported_and_has_the_private_apis_the_engine_uses():
    check_paddle_version(paddle.__version__)
    assert callable(getattr(paddle.Tensor, "_clear_data", None))
    assert callable(getattr(paddle.base.core.DenseTensor, "_share_data_with", None))
