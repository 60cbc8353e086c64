"""The OpenAI-compatible API: request bodies parsed into SamplingParams (`protocol.py`, with the
output keys in `constraints.py`), response bodies and stream chunks (`responses.py`). Pure data;
the HTTP server and run-batch both use it."""
