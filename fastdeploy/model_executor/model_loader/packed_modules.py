"""Checkpoint names <-> parameter names: the packed projections (vLLM's packed_modules_mapping).

The models pack q_proj/k_proj/v_proj into `qkv_proj` (shard ids "q", "k", "v") and gate_proj/up_proj
into `gate_up_proj` (shard ids 0, 1), wherever they sit (attention, MLP, each expert, shared
experts); every other checkpoint name is a parameter name as it is, with shard id None.
"""

# checkpoint module -> (packed module, shard id)
PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
# packed module -> its checkpoint modules, in shard order
SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _split(name: str) -> tuple[str, str, str]:
    """'a.b.q_proj.weight' -> ('a.b.', 'q_proj', 'weight')."""
    head, _, attr = name.rpartition(".")
    prefix, dot, module = head.rpartition(".")
    return prefix + dot, module, attr


def parameter_of(checkpoint_name: str) -> tuple[str, object]:
    """(parameter name, shard id) that a checkpoint tensor fills."""
    prefix, module, attr = _split(checkpoint_name)
    if module in PACKED:
        packed, shard = PACKED[module]
        return f"{prefix}{packed}.{attr}", shard
    return checkpoint_name, None


def checkpoint_names_of(parameter_name: str) -> list[str]:
    """The checkpoint tensors that fill a parameter, in shard order."""
    prefix, module, attr = _split(parameter_name)
    if module in SHARDS:
        return [f"{prefix}{part}.{attr}" for part in SHARDS[module]]
    return [parameter_name]
