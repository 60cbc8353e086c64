import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # pooling_checkpoints
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "model_executor"))  # tiny models
