"""The main job: offline generation with the default model (SmolLM2-135M-Instruct, GGUF).

Runs the prompts and chat messages of FastDeploy's offline inference docs and prints each prompt
with its generated text. Pass a model directory or .gguf file as the first argument to use another.
"""
import sys

from fastdeploy import LLM, SamplingParams

prompts = [
    "把李白的静夜思改写为现代诗",
    "Write me a poem about large language model.",
]
msg1 = [
    {"role": "system", "content": "I'm a helpful AI assistant."},
    {"role": "user", "content": "把李白的静夜思改写为现代诗"},
]
msg2 = [
    {"role": "system", "content": "I'm a helpful AI assistant."},
    {"role": "user", "content": "Write me a poem about large language model."},
]


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None  # None: the default model
    sampling_params = SamplingParams(temperature=0.2, top_p=0.95, max_tokens=128, seed=0)
    llm = LLM(model=model, tensor_parallel_size=1, max_model_len=2048)

    for output in llm.generate(prompts, sampling_params):
        print(f"--- generate\nprompt: {output.prompt!r}\ngenerated: {output.outputs.text!r} ({output.outputs.finish_reason})\n")
    for output in llm.chat([msg1, msg2], sampling_params):
        print(f"--- chat\nprompt: {output.prompt!r}\ngenerated: {output.outputs.text!r} ({output.outputs.finish_reason})\n")


if __name__ == "__main__":
    main()
