"""Multimodal inputs (images, videos) as the engine carries them from the input processor to the model runner."""
