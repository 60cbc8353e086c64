"""examples/structured_outputs.py runs on the default model: its JSON answer parses and validates under
its schema, its regex answer matches, and the forced tool call names the tool with valid arguments."""
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "structured_outputs.py"


def test_structured_outputs_example_runs():
    sys.path.insert(0, str(EXAMPLE.parent))
    import structured_outputs as example

    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600, check=True).stdout
    parsed = re.search(r"^parsed: (.*)$", out, re.M)
    assert parsed, out
    answer = out.split("Describe a software engineer as JSON.\n  -> ", 1)[1].split("\nGive me", 1)[0]
    jsonschema.validate(json.loads(answer), example.PERSON)
    ip = re.search(r"home router\.\n  -> (.*)$", out, re.M).group(1)
    assert re.fullmatch(r"(\d{1,3}\.){3}\d{1,3}", ip)
    assert re.search(r"sky blue\? Answer yes or no\.\n  -> (yes|no)$", out, re.M)
    call = re.search(r"^tool call: get_weather (.*)$", out, re.M)
    assert call, out
    jsonschema.validate(json.loads(call.group(1)), example.WEATHER["function"]["parameters"])
