"""The import rule of docs/design.md "Layers", enforced on the source.

Every module of `fastdeploy/` is parsed (ast, no import runs): each `import` / `from ... import`
naming a `fastdeploy` module, at top level or inside a function, must point to the importer's own
layer or one below it in LAYERS. The shared leaves (SHARED_LEAVES: data types, settings, step
messages) may be imported from any layer. A module is mapped to its layer by the longest package
prefix in LAYERS, so a new file in a listed package is covered without editing this test; a module
that no prefix covers fails `test_every_module_has_a_layer` (add its package to the table here and
in docs/design.md). Failures name file:line of each import that points up.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "fastdeploy"
DESIGN = PACKAGE_ROOT.parent / "docs" / "design.md"

# Top to bottom, as docs/design.md's table. Each entry: (layer, module prefixes).
LAYERS = [
    ("batch jobs", ["fastdeploy.entrypoints.run_batch", "fastdeploy.entrypoints.batch", "fastdeploy.entrypoints.cli"]),
    ("server", ["fastdeploy.entrypoints.openai"]),
    ("facade", ["fastdeploy", "fastdeploy.entrypoints"]),
    ("engine", ["fastdeploy.engine"]),
    ("settings", ["fastdeploy.engine.args_utils", "fastdeploy.config", "fastdeploy.engine.pooling_setup"]),
    ("data types", ["fastdeploy.engine.request", "fastdeploy.engine.sampling_params",
                    "fastdeploy.engine.pooling_params", "fastdeploy.engine.pooling_output"]),
    ("input", ["fastdeploy.input"]),
    ("structured outputs", ["fastdeploy.structured_output"]),
    ("scheduler", ["fastdeploy.engine.sched"]),
    ("KV cache manager", ["fastdeploy.cache_manager.kv_cache_manager", "fastdeploy.cache_manager.kv_cache_sizing"]),
    ("KV blocks", ["fastdeploy.cache_manager"]),
    ("multimodal data", ["fastdeploy.multimodal"]),
    ("executor", ["fastdeploy.executor"]),
    ("worker", ["fastdeploy.worker"]),
    ("speculative decoding", ["fastdeploy.spec_decode"]),
    ("parallelism", ["fastdeploy.distributed"]),
    ("tool parsers", ["fastdeploy.tool_parsers"]),
    ("reasoning", ["fastdeploy.reasoning"]),
    ("output", ["fastdeploy.output"]),
    ("model", ["fastdeploy.model_executor"]),
    ("rank group", ["fastdeploy.distributed.parallel_state"]),
    ("platform", ["fastdeploy.platforms"]),
]

# Importable from every layer: plain data, settings and the step messages.
SHARED_LEAVES = {
    "fastdeploy.engine.request",
    "fastdeploy.engine.sampling_params",
    "fastdeploy.engine.pooling_params",
    "fastdeploy.engine.pooling_output",
    "fastdeploy.config",
    "fastdeploy.engine.sched.output",
    "fastdeploy.worker.output",
}

# Upward imports allowed on purpose: (importer package prefix, imported module) -> the reason.
ALLOWED_UP = {
    ("fastdeploy.model_executor.layers", "fastdeploy.cache_manager.block_pool"):
        "NULL_BLOCK_ID: block 0, never handed out by the pool, is where block-table entries past a "
        "request's blocks point; the attention layers read that one definition",
}

RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def under(module: str, prefix: str) -> bool:
    """Whether dotted `module` is `prefix` or inside it."""
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The layer whose longest prefix covers `module` (a dotted name), or None. The bare package
    name covers only the package's own `__init__.py`."""
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            covers = module == prefix if prefix == "fastdeploy" else under(module, prefix)
            if covers and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    return best


def allowed_up(importer: str, target: str) -> bool:
    return any(target == t and under(importer, p) for p, t in ALLOWED_UP)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path):
    """(line, dotted module) for every fastdeploy import in the file, function-local ones included.
    `from a.b import c` yields a.b.c when that is a module of the package, else a.b."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if sub in ALL_MODULES else target


SOURCES = sorted(PACKAGE_ROOT.rglob("*.py"))
ALL_MODULES = {module_name(p) for p in SOURCES}


def test_every_module_has_a_layer():
    missing = [str(p.relative_to(PACKAGE_ROOT.parent)) for p in SOURCES if layer_of(module_name(p)) is None]
    assert not missing, f"modules outside every layer of LAYERS: {missing}"


def test_imports_point_down():
    assert len(SOURCES) > 50, f"found only {len(SOURCES)} modules under {PACKAGE_ROOT}"
    upward = []
    for path in SOURCES:
        importer = module_name(path)
        for line, target in imported_modules(path):
            if target != "fastdeploy" and not target.startswith("fastdeploy."):
                continue
            if target in SHARED_LEAVES or allowed_up(importer, target):
                continue
            src, dst = layer_of(importer), layer_of(target)
            if dst is None or RANK[dst] < RANK[src]:
                upward.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line}: {src} imports {target} ({dst})")
    assert not upward, "imports pointing up the layers of docs/design.md:\n" + "\n".join(upward)


def design_table_rows() -> list[tuple[str, list[str]]]:
    """(layer, [package paths]) of each row of docs/design.md's "Layers" table, top to bottom."""
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("layer", "---"):
            continue
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def as_module(doc_path: str) -> str:
    """`engine/sched/` -> fastdeploy.engine.sched; `__init__.py` -> fastdeploy."""
    parts = [p for p in doc_path.removesuffix(".py").split("/") if p and p != "__init__"]
    return ".".join(["fastdeploy", *parts])


def test_design_table_matches_the_layers():
    """docs/design.md's table names existing packages, in the order of LAYERS, and every layer."""
    rows = design_table_rows()
    assert len(rows) >= len(LAYERS) - 1, f"found only {len(rows)} rows in {DESIGN}"
    seen, last = set(), -1
    for name, paths in rows:
        for doc_path in paths:
            assert (PACKAGE_ROOT / doc_path).exists(), f"design.md row {name!r} names missing fastdeploy/{doc_path}"
            layer = layer_of(as_module(doc_path))
            assert RANK[layer] >= last, f"design.md row {name!r} ({doc_path}: {layer}) sits below a lower layer"
            last = RANK[layer]
            seen.add(layer)
    assert seen == set(RANK), f"layers missing from design.md's table: {set(RANK) - seen}"
