"""Installs the `fastdeploy` package (PaddlePaddle-native offline LLM inference).

PaddlePaddle itself is not a requirement here: the CPU wheel `paddlepaddle` and the GPU wheel
`paddlepaddle-gpu` both provide `paddle` and must not be installed together, so README.md's
commands install the right one.

The custom ops' sources travel with the package: `custom_ops/` (setup_ops.py, cpu_ops/*.cc|h,
gpu_ops/*.cu|cuh) is installed as `fastdeploy/_custom_ops/`, where
fastdeploy/model_executor/ops/loader.py looks first (a source checkout's custom_ops/ otherwise), so
a wheel or a non-editable `pip install .` builds the ops on first use like a checkout does.
"""
from setuptools import find_packages, setup

setup(
    name="fastdeploy",
    version="0.1.0",
    description="FastDeploy-compatible offline LLM inference engine on PaddlePaddle, CPU first",
    packages=find_packages(include=["fastdeploy", "fastdeploy.*"]) + ["fastdeploy._custom_ops"],
    package_dir={"fastdeploy._custom_ops": "custom_ops"},  # setup_ops.py comes as its one module
    package_data={"fastdeploy._custom_ops": ["cpu_ops/*.cc", "cpu_ops/*.h", "gpu_ops/*.cu", "gpu_ops/*.cuh"]},
    python_requires=">=3.10",
    install_requires=[
        "numpy",
        "tqdm",
        "safetensors",
        "gguf",
        "jinja2",
        "tokenizers",
        # tokenizer layer and chat templates only; torch is never imported at run time. 5.x: the tokenizer
        # loader uses 5-only APIs (TokenizersBackend, tokenization_utils_base.generate_merges)
        "transformers>=5,<6",
        # structured outputs (fastdeploy/structured_output/): Rust, no dependencies, ~3 MB
        "llguidance>=1.0,<2",
        # the OpenAI-compatible API server (fastdeploy/entrypoints/openai/)
        "fastapi",
        "starlette",  # fastapi's; app.py handles its HTTPException (the router's 404/405)
        "uvicorn",
        "prometheus-client",
    ],
    entry_points={"console_scripts": ["fastdeploy = fastdeploy.entrypoints.cli:main"]},
    extras_require={
        # torch must be exactly 2.13.0 (the CPU wheel) and installed before transformers: README.md does it.
        # sentencepiece and protobuf: the [ernie] extra's, for the ERNIE tokenizer tests (and to build their
        # tokenizer.model files)
        # imageio-ffmpeg: its bundled ffmpeg writes the test videos; the [vl] packages for the VL tests
        # openai: the official client, whose models check the server's bodies and stream chunks
        # sentence-transformers: the oracle of embeddings and cross-encoder scores (tests/pooling)
        "test": ["pytest", "torch==2.13.0", "accelerate", "sentencepiece", "protobuf", "scipy", "hypothesis",
                 "imageio-ffmpeg==0.8.1", "pillow", "decord==0.6.0", "fontpkg-roboto==3.15",
                 "jsonschema", "xgrammar>=0.2.8,<0.3", "openai", "sentence-transformers>=5"],
        # sentencepiece-only tokenizers (ERNIE-4.5's tokenizer.model; fastdeploy/input/tokenizer_loader.py):
        # the model proto is read with protobuf (Paddle brings it too), or with sentencepiece's own schema
        "ernie": ["sentencepiece", "protobuf"],
        # run_batch --data-parallel-size N and the Ray Data helper (fastdeploy/entrypoints/batch/)
        "ray": ["ray[data]>=2.40"],  # [data]: pandas and pyarrow, which ray.data needs
        # LLM(guided_decoding_backend="xgrammar") (fastdeploy/structured_output/xgrammar_backend.py): xgrammar
        # needs torch (install torch==2.13.0 first, README.md) and pulls triton; 0.2.8 is the API it is built on
        "xgrammar": ["xgrammar>=0.2.8,<0.3"],
        # ERNIE-4.5-VL images and videos (fastdeploy/input/image_processor.py, video_processor.py): pillow
        # resizes; decord decodes videos (pinned: unmaintained since 2021, kept behind
        # video_processor.open_video); Roboto draws the frames' timestamps as FastDeploy does
        "vl": ["pillow", "decord==0.6.0", "fontpkg-roboto==3.15",
                 "jsonschema"],
    },
)
