"""Structured outputs and tool calls on the default model (SmolLM2-135M-Instruct): a JSON schema, a
regex, a choice, and a forced tool call. Run: python examples/structured_outputs.py"""
import json

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


def main():
    llm = LLM(model=None, max_model_len=1024)
    asks = ["Describe a software engineer as JSON.", "Give me the IP address of a home router.",
            "Is the sky blue? Answer yes or no."]
    constraints = [GuidedDecodingParams(json=PERSON), GuidedDecodingParams(regex=r"(\d{1,3}\.){3}\d{1,3}"),
                   GuidedDecodingParams(choice=["yes", "no"])]
    outputs = llm.chat([[{"role": "user", "content": a}] for a in asks],
                       [SamplingParams(temperature=0, max_tokens=200, guided_decoding=c) for c in constraints],
                       use_tqdm=False)
    for ask, output in zip(asks, outputs):
        print(f"{ask}\n  -> {output.outputs.text}")
    print("parsed:", json.loads(outputs[0].outputs.text))

    call = llm.chat([{"role": "user", "content": "What is the weather in Paris?"}],
                    SamplingParams(temperature=0, max_tokens=100), tools=[WEATHER],
                    tool_choice={"type": "function", "function": {"name": "get_weather"}}, use_tqdm=False)
    for tool_call in call[0].outputs.tool_calls:
        print("tool call:", tool_call.function.name, tool_call.function.arguments)


if __name__ == "__main__":
    main()
