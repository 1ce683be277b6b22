"""tokenmill's library: tokenizer, artifact store, corpus stages and the LM trainer.

Nothing here imports Prefect; `tasks/` and `flows/` wrap these functions.

    from pipeline_lib import Tokenizer
    tok = Tokenizer.train(["some text", ...], vocab_size=4096, pattern="cl100k")
    ids = tok.encode("hello world")          # numpy uint32
    tok.decode(ids)
"""

from pipeline_lib.store import ArtifactStore, VersionRef
from pipeline_lib.tokenizer import Tokenizer, backend
from pipeline_lib.version import __version__

__all__ = ["ArtifactStore", "Tokenizer", "VersionRef", "__version__", "backend"]
