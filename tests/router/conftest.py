"""The fixtures of tests/python (the kvllm binary, the stories260K model) for the router tests."""
import importlib.util
import sys
from pathlib import Path

_py = Path(__file__).resolve().parents[1] / "python"
sys.path.insert(0, str(_py))
_spec = importlib.util.spec_from_file_location("kvllm_py_conftest", _py / "conftest.py")
_conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conf)
kvllm, shared, stories = _conf.kvllm, _conf.shared, _conf.stories
