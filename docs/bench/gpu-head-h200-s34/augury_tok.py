"""augury's CLI with the target's tokenizer read from .gpu/tok (the device's transformers lacks convert_gguf_tokenizer)."""
import sys
from pathlib import Path

from augury.models import gguf
from augury.models.tokenizer import Tokenizer

_TOK = Path(__file__).resolve().parent / "tok"
gguf.read_tokenizer = lambda path: Tokenizer.load(_TOK)
from augury.cli import main  # noqa: E402

sys.exit(main())
