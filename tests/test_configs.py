"""Configs are the interface: every stage parameter is one config field, and the CLI's
options, the flows' parameter schema and the deployments' parameters all come from it."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import pytest
import yaml

from flows import cli, cli_options
from pipeline_lib.config import STRICT, ReportConfig, SampleConfig, doc, fields_of, validate
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.counting import CountConfig
from pipeline_lib.errors import ConfigError
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.stages import TokenizerConfig
from pipeline_lib.token_shards import EncodeConfig

ROOT = Path(__file__).resolve().parent.parent
STAGE_CONFIGS = (CorpusConfig, CountConfig, TokenizerConfig, EncodeConfig, LMConfig)
ALL_CONFIGS = (*STAGE_CONFIGS, ReportConfig, SampleConfig)
# command -> the configs whose every field it offers
COMMANDS = {
    ("run",): (CorpusConfig, CountConfig, TokenizerConfig, EncodeConfig, LMConfig),
    ("tokenizer", "train"): (CorpusConfig, CountConfig, TokenizerConfig),
    ("encode",): (CorpusConfig, EncodeConfig),
    ("lm", "train"): (LMConfig,),
    ("lm", "sample"): (SampleConfig,),
    ("report",): (CorpusConfig, ReportConfig),
}


def _subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def _flows():
    from flows import lab, pipeline, sweep

    return {
        "tokenmill_pipeline": pipeline.tokenmill_pipeline,
        "corpus_flow": pipeline.corpus_flow,
        "tokenizer_flow": pipeline.tokenizer_flow,
        "encode_flow": pipeline.encode_flow,
        "lm_flow": pipeline.lm_flow,
        "report_flow": pipeline.report_flow,
        "tokenizer_train_flow": pipeline.tokenizer_train_flow,
        "encode_corpus_flow": pipeline.encode_corpus_flow,
        "compare_flow": lab.compare_flow,
        "sweep_flow": sweep.sweep_flow,
    }


def _schema(flow) -> dict:
    from prefect.utilities.callables import parameter_schema

    return parameter_schema(flow).model_dump()


def test_every_field_is_described_and_typed():
    for cls in ALL_CONFIGS:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        names = {f.name for f in fields_of(cls)}
        # Every field is described, except CorpusConfig.storage_options (given by the flow).
        assert names == {f.name for f in dataclasses.fields(cls)} - {"storage_options"}, cls
        for f in fields_of(cls):
            assert f.description and not f.description.endswith("."), (cls, f.name)


def test_cli_options_come_from_the_config_fields():
    parser = cli.build_parser()
    for path, classes in COMMANDS.items():
        sub = _subparser(parser, path)
        for cls in classes:
            for f in fields_of(cls):
                action = _option(sub, cli.flag_of(cls, f.name))
                assert action.help.replace("%%", "%").startswith(f.description), (path, f.name)
                if f.choices:
                    assert tuple(action.choices) == f.choices
                if f.type is bool:
                    assert isinstance(action, argparse.BooleanOptionalAction)
                if f.repeated:
                    assert action.default is None  # the config's default applies
                elif path != ("report",) or cls is not CorpusConfig:
                    assert action.default == f.default, (path, f.name)
        # No parameters beyond the configs' (and the command's own: store, runner ...).
        args = sub.parse_args([])
        built = cli.configs_from_args(args, tuple(n for n, c in cli._config_classes().items() if c in classes))
        for cfg in built.values():
            assert cfg == type(cfg)() or path == ("report",)


def test_old_flag_names_still_work():
    args = cli.build_parser().parse_args(
        [
            "run",
            "--corpus",
            "a.txt",
            "--corpus",
            "b.txt",
            "--shards",
            "3",
            "--documents",
            "paragraph",
            "--vocab-size",
            "300",
            "--pattern",
            "gpt2",
            "--special-token",
            "<|a|>",
            "--special-token",
            "<|b|>",
            "--min-frequency",
            "3",
            "--separator",
            "",
            "--lm-steps",
            "5",
            "--lm-preset",
            "tiny",
            "--n-layer",
            "1",
            "--seed",
            "7",
            "--threads-per-shard",
            "2",
            "--no-doc-table",
        ]
    )
    c = cli.configs_from_args(args, cli.RUN_CONFIGS)
    assert (
        c["corpus"].sources == ("a.txt", "b.txt") and c["corpus"].n_shards == 3 and c["corpus"].documents == "paragraph"
    )
    assert c["tokenizer"] == TokenizerConfig(vocab_size=300, special_tokens=("<|a|>", "<|b|>"), min_frequency=3)
    assert c["count"] == CountConfig(pattern="gpt2")
    assert c["encode"] == EncodeConfig(separator=None, workers=2, doc_table=False)
    assert c["lm"] == LMConfig(preset="tiny", steps=5, n_layer=1, seed=7)
    report = cli.build_parser().parse_args(["report", "--vocab-sizes", "256,512", "--vocab-sizes", "1024"])
    assert cli.configs_from_args(report, cli.REPORT_CONFIGS)["report"].vocab_sizes == (256, 512, 1024)
    assert cli.configs_from_args(report, cli.REPORT_CONFIGS)["corpus"].n_shards == 10


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--lm-steps", "0"], "--lm-steps"),
        (["--vocab-size", "100"], "--vocab-size"),
        (["--shards", "0"], "--shards"),
        (["--n-head", "5"], "--n-head"),
        (["--threads-per-shard", "-1"], "--threads-per-shard"),
    ],
)
def test_bad_values_are_refused_before_any_work(argv, flag, tmp_path, capsys):
    store = tmp_path / "store"
    assert cli.main(["run", "--store", str(store), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("tokenmill: error:") == 1 and f"error: {flag} " in err, err
    assert not store.exists()  # refused before any stage ran


def test_flow_schemas_come_from_the_config_fields():
    from flows.pipeline import config_parameters

    seen = set()
    for name, flow in _flows().items():
        schema = _schema(flow)
        for param, cls in config_parameters(flow).items():
            seen.add(cls)
            definition = schema["definitions"][cls.__name__]
            assert schema["properties"][param]["$ref"].endswith(cls.__name__)
            assert definition.get("additionalProperties") is False, cls  # unknown fields refused
            for f in fields_of(cls):
                prop = definition["properties"][f.name]
                assert prop["description"] == f.description, (name, cls, f.name)
                default = list(f.default) if isinstance(f.default, tuple) else f.default
                assert prop.get("default") == default, (name, f.name)
                if f.choices:  # a repeated field's choices are its items' (a multi-select in the UI)
                    assert (prop["items"] if f.repeated else prop)["enum"] == list(f.choices), (name, f.name)
    assert seen >= {*STAGE_CONFIGS, ReportConfig}


def test_flow_annotations_are_the_config_classes():
    """Not strings: a served flow runs a cloudpickled copy whose globals lack the names."""
    for flow in _flows().values():
        for name, annotation in flow.fn.__annotations__.items():
            assert not isinstance(annotation, str), (flow.name, name)


def test_flows_spell_out_no_stage_parameter():
    """The configs carry the parameters: no flow, task or deployment names one."""
    names = {f.name for cls in (*STAGE_CONFIGS, ReportConfig) for f in fields_of(cls)} - {
        "sources",
        "seed",
        "device",
        "pattern",
        "documents",
        "workers",
        "errors",
        "unit",  # also the engine's word for one shard of a mapped stage (tasks/factory.py)
    }
    names |= {"threads_per_shard", "lm_steps", "lm_preset", "model_overrides"}
    files = [*ROOT.glob("flows/*.py"), *ROOT.glob("tasks/*.py"), *ROOT.glob("deployments/*.py")]
    for path in files:
        text = path.read_text()
        if path.name == "cli_options.py":  # the flag aliases name fields
            text = text.split("FLAG_ALIASES", 1)[0] + text.split("def _config_classes", 1)[1]
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for name in names:
            # as a parameter or keyword (`name=`, `name:`), not as a manifest key (meta["name"])
            hits = re.findall(rf"(?<![\w\"'.]){name}\s*(?:=(?!=)|:\s*[A-Za-z])", code)
            assert not hits, f"{path.relative_to(ROOT)} spells out stage parameter {name!r}"


def test_deployment_parameters_validate_against_the_configs():
    from deployments.serve import RETRAIN_PARAMETERS, TOKENIZE_PARAMETERS, check_spec, deployment_specs
    from flows.pipeline import check_parameters, tokenmill_pipeline

    for spec in deployment_specs("/s", ["/c.txt"], {"anon": True}):
        check_spec(spec)
    for params in (TOKENIZE_PARAMETERS, RETRAIN_PARAMETERS):
        check_parameters(tokenmill_pipeline, params)
    # prefect.yaml's parameters, their settings placeholders filled in
    for d in yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]:
        flow = _flows()[d["entrypoint"].rsplit(".", 1)[1]]  # module path: deployments.entrypoints.FLOW
        rendered = {k: v for k, v in d["parameters"].items() if not (isinstance(v, str) and v.startswith("{{"))}
        for k, v in rendered.items():
            if isinstance(v, dict):
                rendered[k] = {fk: fv for fk, fv in v.items() if not (isinstance(fv, str) and fv.startswith("{{"))}
        check_parameters(flow, rendered)
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_sise: unknown field"):
        check_parameters(tokenmill_pipeline, {"tokenizer": {"vocab_sise": 300}})
    with pytest.raises(ConfigError, match=r"count\.pattern: .*'gpt2', 'cl100k' or 'o200k', got 'gpt4'"):
        check_parameters(tokenmill_pipeline, {"count": {"pattern": "gpt4"}})
    with pytest.raises(ConfigError, match="unknown parameter"):
        check_parameters(tokenmill_pipeline, {"vocab_size": 300})


def test_flow_run_refuses_an_unknown_field(prefect_harness):
    """Prefect validates a config dict against the config before the run starts."""
    from flows.pipeline import corpus_flow

    state = corpus_flow(corpus={"sources": ["x.txt"], "n_shard": 3}, store="memory://never", return_state=True)
    assert state.is_failed() and "n_shard" in state.message, state.message


def test_validate_messages():
    assert validate(TokenizerConfig, {"vocab_size": 300, "special_tokens": ["<|a|>"]}) == TokenizerConfig(
        300, ("<|a|>",)
    )
    with pytest.raises(ConfigError, match=r"LMConfig: steps=0"):
        validate(LMConfig, {"steps": 0})
    with pytest.raises(ConfigError, match=r"EncodeConfig\.placement"):
        validate(EncodeConfig, {"placement": "middle"})


def test_a_new_field_appears_in_the_cli_and_the_schema_without_other_edits(monkeypatch):
    """Adding a parameter is adding one field: the CLI and the flow's schema pick it up."""
    from prefect import flow

    @dataclass(frozen=True)
    class TokenizerConfigPlus(TokenizerConfig):
        __pydantic_config__ = STRICT

        max_token_bytes: Annotated[int, doc("longest token in bytes (made up for this test)")] = 16
        merge_order: Annotated[Literal["count", "bytes"], doc("tie-break of equal pairs (made up)")] = "count"

    TokenizerConfigPlus.__name__ = TokenizerConfigPlus.__qualname__ = "TokenizerConfig"  # the CLI's aliases key on it
    classes = {**cli._config_classes(), "tokenizer": TokenizerConfigPlus}
    monkeypatch.setattr(cli_options, "_config_classes", lambda: classes)

    sub = _subparser(cli.build_parser(), ("tokenizer", "train"))
    action = _option(sub, "--max-token-bytes")
    assert action.help.startswith("longest token in bytes") and action.default == 16
    assert tuple(_option(sub, "--merge-order").choices) == ("count", "bytes")
    args = sub.parse_args(["--max-token-bytes", "8", "--vocab-size", "300"])
    built = cli.configs_from_args(args, ("tokenizer",))["tokenizer"]
    assert built.max_token_bytes == 8 and built.vocab_size == 300

    def plus_fn(tokenizer=TokenizerConfigPlus()) -> None: ...

    plus_fn.__annotations__ = {"tokenizer": TokenizerConfigPlus, "return": None}  # a local class: no string annotation
    plus = flow(name="plus")(plus_fn)

    schema = _schema(plus)
    definition = schema["definitions"][schema["properties"]["tokenizer"]["$ref"].rsplit("/", 1)[1]]
    assert definition["properties"]["max_token_bytes"]["description"] == (
        "longest token in bytes (made up for this test)"
    )
    assert definition["properties"]["merge_order"]["enum"] == ["count", "bytes"]
    assert definition["properties"]["vocab_size"]["default"] == 4096


def test_unified_defaults():
    # One value each, defined in the configs (see docs/architecture.md).
    assert CorpusConfig().documents == "line"
    assert SampleConfig().top_k == 200
    assert ReportConfig().vocab_sizes == (256, 300, 491, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    assert LMConfig().steps is None  # the preset's own
