"""Every stage config by the name flows, deployments and the CLI give it.

Above the stage modules (they import `pipeline_lib.config` for the field descriptions; this
module imports them), so `config` and the stages form no import circle.
"""

from __future__ import annotations

from pipeline_lib.config import ReportConfig, SampleConfig


def stage_configs() -> dict[str, type]:
    """``{"corpus": CorpusConfig, "count": CountConfig, ...}``, with the document stages'
    configs (`pipeline_lib.stages.documents`) under their option names.

    Imported on call: the configs live beside their stages (numpy, pyarrow), and the CLI
    asks only for the command it runs.
    """
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.lm.stage_config import LMConfig
    from pipeline_lib.stages import TokenizerConfig
    from pipeline_lib.stages.documents import document_stages
    from pipeline_lib.token_shards import EncodeConfig

    return {
        "corpus": CorpusConfig,
        **{entry.option: entry.stage.config for entry in document_stages()},
        "count": CountConfig,
        "tokenizer": TokenizerConfig,
        "encode": EncodeConfig,
        "lm": LMConfig,
        "report": ReportConfig,
        "sample": SampleConfig,
    }
