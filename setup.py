"""Installs the `fastdeploy` package (PaddlePaddle-native offline LLM inference).

PaddlePaddle itself is not a requirement here: the CPU wheel `paddlepaddle` and the GPU wheel
`paddlepaddle-gpu` both provide `paddle` and must not be installed together, so README.md's
commands install the right one.
"""
from setuptools import find_packages, setup

setup(
    name="fastdeploy",
    version="0.1.0",
    description="FastDeploy-compatible offline LLM inference engine on PaddlePaddle, CPU first",
    packages=find_packages(include=["fastdeploy", "fastdeploy.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numpy",
        "tqdm",
        "safetensors",
        "gguf",
        "jinja2",
        "tokenizers",
        "transformers",  # tokenizer layer and chat templates only; torch is never imported at run time
    ],
    entry_points={"console_scripts": ["fastdeploy = fastdeploy.entrypoints.cli:main"]},
    extras_require={
        # torch must be exactly 2.13.0 (the CPU wheel) and installed before transformers: README.md does it.
        "test": ["pytest", "torch==2.13.0", "accelerate", "sentencepiece", "scipy", "hypothesis"],
        # run_batch --data-parallel-size N and the Ray Data helper (fastdeploy/entrypoints/batch/)
        "ray": ["ray[data]>=2.40"],  # [data]: pandas and pyarrow, which ray.data needs
    },
)
