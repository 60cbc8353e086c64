"""ERNIE-4.5-VL input preprocessing: this engine's image processor against transformers' PIL image processor
(the same output bit for bit) on 448x448, 1024x1024 and 1080x1920 RGB images, and a video's frame
sampling + timestamps + resizing at FastDeploy's defaults (a 10 s, 640x360, 30 fps mp4 made with
imageio-ffmpeg: 20 frames at 2 fps, resized into video_max_pixels).

Median of 7 runs after one warm-up, one process, whatever threads numpy/PIL use.

    python benchmarks/benchmark_vl_preprocess.py
"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # vl_helpers.write_mp4

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from fastdeploy.input.image_processor import preprocess_frames, preprocess_image  # noqa: E402
from fastdeploy.input.video_processor import VideoSampling, sample_video  # noqa: E402


def median_ms(fn, runs=7):
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main():
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    from vl_helpers import write_mp4

    hf = Ernie4_5_VLMoeImageProcessorPil()
    rng = np.random.default_rng(0)
    print("image            ours ms   transformers ms")
    for height, width in ((448, 448), (1024, 1024), (1080, 1920)):
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        ours = median_ms(lambda: preprocess_image(image))
        ref = median_ms(lambda: hf(images=[image], return_tensors="np"))
        print(f"{height}x{width:<10} {ours:9.1f} {ref:17.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        t = np.arange(300)[:, None, None, None]
        frames = ((t + np.arange(640)[None, None, :, None] + np.arange(360)[None, :, None, None]) % 256).astype(np.uint8)
        path = Path(tmp) / "v.mp4"
        write_mp4(path, np.broadcast_to(frames, (300, 360, 640, 3)).copy(), fps=30)
        sampled = median_ms(lambda: sample_video(str(path), VideoSampling()), runs=3)
        pixels = median_ms(lambda: preprocess_frames(sample_video(str(path), VideoSampling())), runs=3)
        print(f"video 10 s 640x360 30 fps: decode+sample+timestamps {sampled:.0f} ms, + resize/normalise/patches "
              f"{pixels:.0f} ms")


if __name__ == "__main__":
    main()
