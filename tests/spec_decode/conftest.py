import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "model_executor"))  # tiny_llama
sys.path.insert(0, str(TESTS / "entrypoints" / "openai"))  # running_server
