"""Every third-party package fastdeploy/ imports is declared in setup.py: in install_requires, or in
an extra whose name the ImportError gives when the package is missing (`pip install "fastdeploy[X]"`).

(a) static: every `import X` / `from X import` in fastdeploy/ (top-level and inside functions), and
    every `importlib.import_module("X")`, mapped to its distribution, is in install_requires or an
    extra; paddle is the documented exception (README's commands install `paddlepaddle` or
    `paddlepaddle-gpu`, never both, so setup.py cannot name either).
(b) dynamic: with the optional packages unimportable, every module of fastdeploy imports, and the
    optional features raise ImportError naming their extra.
"""
import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fastdeploy"
NOT_REQUIREMENTS = {"paddle"}  # import names setup.py must not declare (see the module doc)
# import name (or dotted prefix) -> distribution, where the installed metadata cannot tell or the
# package may be absent here
DISTRIBUTIONS = {"google.protobuf": "protobuf", "yaml": "pyyaml", "sentencepiece": "sentencepiece",
                 "ray": "ray", "jinja2": "jinja2", "gguf": "gguf", "safetensors": "safetensors",
                 "tokenizers": "tokenizers", "transformers": "transformers", "numpy": "numpy", "tqdm": "tqdm",
                 "PIL": "pillow", "decord": "decord", "fontpkg_roboto": "fontpkg-roboto"}
# what an extra is for, which no import in fastdeploy/ shows: transformers' import_protobuf reads a
# sentencepiece tokenizer.model with protobuf, or with sentencepiece's schema where installed
INDIRECT = {"ernie": {"protobuf", "sentencepiece"}}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0))


def setup_requirements() -> tuple[set[str], dict[str, set[str]]]:
    """install_requires and extras_require of setup.py's setup() call, as normalized distribution names."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (call,) = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "setup"]
    keywords = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords
                if keyword.arg in ("install_requires", "extras_require")}
    required = {_requirement_name(r) for r in keywords.get("install_requires", [])}
    extras = {extra: {_requirement_name(r) for r in requirements}
              for extra, requirements in keywords.get("extras_require", {}).items()}
    return required, extras


def imported_names() -> dict[str, list[str]]:
    """{dotted module name: [file:line, ...]} of every absolute import in fastdeploy/ that is neither
    standard library nor fastdeploy itself."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                  in ("import_module", "__import__") and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                names = [node.args[0].value]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "fastdeploy" or name.startswith("."):
                    continue
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def distributions_of(name: str) -> set[str]:
    """The distributions that may provide import `name` (the explicit table first, then installed metadata)."""
    parts = name.split(".")
    for length in range(len(parts), 0, -1):
        prefix = ".".join(parts[:length])
        if prefix in DISTRIBUTIONS:
            return {_normalize(DISTRIBUTIONS[prefix])}
    installed = importlib.metadata.packages_distributions().get(parts[0], [])
    return {_normalize(d) for d in installed} or {_normalize(parts[0])}


def test_every_third_party_import_is_declared():
    required, extras = setup_requirements()
    declared = required.union(*extras.values())
    undeclared = {}
    for name, places in imported_names().items():
        if name.split(".")[0] in NOT_REQUIREMENTS:
            continue
        if not distributions_of(name) & declared:
            undeclared[name] = places
    assert not undeclared, f"imports in neither install_requires nor an extra of setup.py: {undeclared}"
    for top in NOT_REQUIREMENTS:  # installed by README's command, never by setup.py
        assert not {"paddlepaddle", "paddlepaddle-gpu", top} & declared


def test_installed_versions_satisfy_setup_py_and_transformers_is_5():
    """install_requires' version ranges hold in this environment, and transformers' is 5.x: the tokenizer
    loader imports names transformers 4 lacks."""
    from packaging.requirements import Requirement

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (listed,) = [node.value for node in ast.walk(tree) if isinstance(node, ast.keyword)
                 and node.arg == "install_requires"]
    requirements = {_requirement_name(text): Requirement(text) for text in ast.literal_eval(listed)}
    for name, requirement in requirements.items():
        assert requirement.specifier.contains(importlib.metadata.version(name)), (requirement, name)
    assert str(requirements["transformers"].specifier) == "<6,>=5"
    from transformers import TokenizersBackend  # noqa: F401  (5.x only)
    from transformers.tokenization_utils_base import generate_merges  # noqa: F401  (5.x only; 4.x: convert_slow_tokenizer)


def test_the_scan_sees_lazy_imports_and_the_known_packages():
    names = imported_names()
    assert "ray" in names  # imported inside a function (entrypoints/batch/ray_workers.py)
    assert any(name.startswith("transformers") for name in names)
    assert distributions_of("google.protobuf.message") == {"protobuf"}
    assert distributions_of("yaml") == {"pyyaml"}


def test_extras_named_by_messages_exist_and_cover_their_packages():
    required, extras = setup_requirements()
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"fastdeploy\[([a-z0-9_-]+)\]", path.read_text(encoding="utf-8")))
    assert named >= {"ray", "ernie", "vl"}
    assert named <= set(extras), f"messages name extras setup.py lacks: {named - set(extras)}"
    assert "ray" in extras["ray"]
    for extra, packages in INDIRECT.items():
        assert packages <= extras[extra]
    # README's test command installs .[test,ray]: the ERNIE tokenizer tests need [ernie]'s packages
    assert extras["ernie"] <= extras["test"]


# ---- (b) the optional packages made unimportable ---------------------------------------------
# `sys.modules[name] = None` is Python's own "not installed" for one process: `import name` raises
# ModuleNotFoundError and importlib.util.find_spec(name) returns None (which is how transformers
# decides whether sentencepiece, protobuf, torch, ... are available). A meta_path finder that raised
# instead would break those find_spec checks, which real absence does not.
OPTIONAL = ["sentencepiece", "ray", "pandas", "pyarrow", "torch", "accelerate", "scipy", "pytest", "decord",
            "fontpkg_roboto", "imageio_ffmpeg"]

CHILD = r"""
import json, pkgutil, sys, importlib
BLOCKED = json.loads(sys.argv[1])
for name in BLOCKED:
    sys.modules[name] = None
import fastdeploy

failed = {}
for info in pkgutil.walk_packages(fastdeploy.__path__, "fastdeploy."):
    try:
        importlib.import_module(info.name)
    except Exception as e:
        failed[info.name] = f"{type(e).__name__}: {e}"
imported = sorted(name for name in sys.modules if name.startswith("fastdeploy"))
loaded = sorted(name for name in BLOCKED if sys.modules.get(name) is not None)

def error_of(call):
    try:
        call()
    except ImportError as e:
        return str(e)
    return None

from fastdeploy.entrypoints.batch.ray_workers import RayWorkers
ray_error = error_of(lambda: RayWorkers({"model": sys.argv[2]}, 1))
from fastdeploy.input.video_processor import open_video, timestamp_font
vl_errors = [error_of(lambda: open_video(b"x")), error_of(lambda: timestamp_font(10))]

# protobuf cannot be absent where paddle is installed (paddle requires it, and it is loaded by now):
# hide it from everything imported from here on, as an environment without it would
for name in [n for n in sys.modules if n == "google.protobuf" or n.startswith("google.protobuf.")]:
    del sys.modules[name]
sys.modules["google.protobuf"] = None
from fastdeploy.input.tokenizer_loader import load_model_tokenizer
ernie_error = error_of(lambda: load_model_tokenizer(sys.argv[3]))
print(json.dumps({"failed": failed, "imported": imported, "loaded": loaded,
                  "ray_error": ray_error, "ernie_error": ernie_error, "vl_errors": vl_errors}))
"""


@pytest.fixture(scope="module")
def ernie_dir(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests" / "input"))
    try:
        from tokenizer_dirs import train_sentencepiece, write_ernie_tokenizer
    finally:
        sys.path.remove(str(ROOT / "tests" / "input"))
    return write_ernie_tokenizer(tmp_path_factory.mktemp("ernie") / "tokenizer", train_sentencepiece())


def test_without_optional_packages_everything_imports_and_features_name_their_extra(ernie_dir, smollm_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's fastdeploy
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(OPTIONAL), smollm_path, str(ernie_dir)],
                            capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["failed"], found["failed"]
    assert not found["loaded"]
    modules = {name for name in found["imported"]}
    for path in PACKAGE.rglob("*.py"):  # pkgutil really walked every module
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if "_custom_ops" not in parts:
            assert name in modules, name
    assert found["ray_error"] and 'pip install "fastdeploy[ray]"' in found["ray_error"], found["ray_error"]
    assert found["ernie_error"] and 'pip install "fastdeploy[ernie]"' in found["ernie_error"], found["ernie_error"]
    assert all(e and 'pip install "fastdeploy[vl]"' in e for e in found["vl_errors"]), found["vl_errors"]


def test_sentencepiece_alone_is_not_needed_for_an_ernie_tokenizer(ernie_dir):
    """protobuf (which Paddle brings) reads the proto: without the sentencepiece package it still loads."""
    code = ("import sys; sys.modules['sentencepiece'] = None\n"
            "from fastdeploy.input.tokenizer_loader import load_model_tokenizer\n"
            f"print(load_model_tokenizer({str(ernie_dir)!r}).encode('User: 2+2?'))")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    from fastdeploy.input.tokenizer_loader import load_model_tokenizer

    expected = load_model_tokenizer(ernie_dir).encode("User: 2+2?")  # sentencepiece installed here
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected
