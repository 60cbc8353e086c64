"""An engine process for test_worker_lifecycle.py: `python engine_script.py MODEL exit|generate`.

Prints "pids <rank 0 pid> <rank 1 pid>", then either returns without shutdown() ("exit") or prints
"generating" and runs a generate long enough to be interrupted ("generate")."""
import signal
import sys

from fastdeploy import LLM, SamplingParams

# Ctrl-C raises KeyboardInterrupt even when the test run was started in the background by a shell,
# which makes its children ignore SIGINT (Python then installs no handler of its own)
signal.signal(signal.SIGINT, signal.default_int_handler)
llm = LLM(model=sys.argv[1], tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
print("pids", *llm.llm_engine.executor.pids, flush=True)
if sys.argv[2] == "generate":
    print("generating", flush=True)
    llm.generate([[5, 6, 7]] * 8, SamplingParams(max_tokens=500, ignore_eos=True), use_tqdm=False)
