"""Speculative decoding (docs/speculative_decoding.md): draft proposers run by the model runner
(`ngram.py` prompt lookup, `draft_model.py` a smaller model), the acceptance rule of a verification
step (`verify.py`) and the scheduler's policy of who speculates when (`policy.py`)."""
