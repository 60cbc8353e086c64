"""ERNIE-4.5-VL through LLM.generate: the generate example of FastDeploy's offline inference docs (the
prompt rendered by Ernie4_5Tokenizer, the images and videos passed as `multimodal_data`), on a local
model directory and local files instead of a model name and https URLs.

    python examples/vl_generate.py MODEL_DIR IMAGE [VIDEO] [--max-tokens N]
"""
import argparse
import io
from pathlib import Path

from PIL import Image

from fastdeploy.entrypoints.llm import LLM
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("model")
parser.add_argument("image")
parser.add_argument("video", nargs="?")
parser.add_argument("--max-tokens", type=int, default=6400)
args = parser.parse_args()

PATH = args.model
tokenizer = Ernie4_5Tokenizer.from_pretrained(PATH)

content = [{"type": "image_url", "image_url": {"url": args.image}}]
if args.video:
    content.append({"type": "video_url", "video_url": {"url": args.video}})
messages = [{"role": "user", "content": content + [{"type": "text", "text": "图中的文物属于哪个年代"}]}]

prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
images, videos = [], []
for message in messages:
    content = message["content"]
    if not isinstance(content, list):
        continue
    for part in content:
        if part["type"] == "image_url":
            url = part["image_url"]["url"]
            image_bytes = Path(url).read_bytes()
            img = Image.open(io.BytesIO(image_bytes))
            images.append(img)
        elif part["type"] == "video_url":
            url = part["video_url"]["url"]
            video_bytes = Path(url).read_bytes()
            videos.append({
                "video": video_bytes,
                "max_frames": 30
            })

sampling_params = SamplingParams(temperature=0.1, max_tokens=args.max_tokens)
llm = LLM(model=PATH, tensor_parallel_size=1, max_model_len=32768, enable_mm=True,
          limit_mm_per_prompt={"image": 100}, reasoning_parser="ernie-45-vl")
outputs = llm.generate(prompts={
    "prompt": prompt,
    "multimodal_data": {
        "image": images,
        "video": videos
    }
}, sampling_params=sampling_params)

# Output results
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    reasoning_text = output.outputs.reasoning_content
    print(f"prompt: {prompt!r}\nreasoning: {reasoning_text!r}\ngenerated: {generated_text!r}\n"
          f"image tokens: {output.num_input_image_tokens}, video tokens: {output.num_input_video_tokens}")
