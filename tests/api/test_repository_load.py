"""The model repository's load and unload as operations, on the real repository
folder, PostgreSQL and ONNX Runtime: LOADING recorded and committed before a
version is checked (another process sees it), then the final state, each a unit
of work of its own; Triton's `config` written into the cards or refused naming
its field, with nothing written; Triton's other parameters; the command line's
`models load` and `models unload`."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.cards import ModelCard
from app.errors import InvalidModel, InvalidParameter
from app.operations.models import ModelOperations
from app.operations.triton import model_config
from app.platform.database import Database
from app.platform.settings import Settings
from app.repository.control import CHECKING, Check
from app.repository.intake import check_loadable
from app.repository.overrides import parse_config
from app.repository.registry import ModelRepository
from app.repository.states import SharedStates
from manage import cli
from tests.conftest import service_env


def copy_model(root: Path, versions: tuple[str, ...] = ("1",)) -> str:
    """The digits model's files under a fresh name, as `versions`."""
    name = f"load-{uuid.uuid4().hex[:8]}"
    for version in versions:
        shutil.copytree(root / "digits" / "1", root / name / version)
    return name


@pytest.fixture
def another_process(settings: Settings, database: Database) -> ModelRepository:
    """What another API or worker process sees: a repository of its own, reading
    the shared states from PostgreSQL at every look."""
    return ModelRepository(settings.model_repository, SharedStates(database.engine), ttl_s=0)


@pytest.fixture
def scope(database: Database) -> Iterator[None]:
    with database.scope():
        yield


def operations(settings: Settings, database: Database, check: Check) -> ModelOperations:
    repository = ModelRepository(settings.model_repository, SharedStates(database.engine))
    return ModelOperations(database, repository, check=check)


def states(repository: ModelRepository, name: str) -> dict[str, tuple[str, str]]:
    return {s.version: (s.state, s.reason) for s in repository.index() if s.name == name}


def raw_card(settings: Settings, name: str, version: str = "1") -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (settings.model_repository / name / version / "card.json").read_text()
    )
    return loaded


@pytest.mark.usefixtures("scope")
def test_a_load_records_loading_before_it_checks_then_the_final_state(
    settings: Settings, database: Database, another_process: ModelRepository
) -> None:
    name = copy_model(settings.model_repository)
    seen: list[tuple[tuple[str, str], list[str]]] = []

    def check(card: ModelCard) -> None:  # what another process sees as the check starts
        seen.append((states(another_process, name)[card.version], another_process.versions(name)))
        check_loadable(card)  # then ONNX Runtime's check itself

    ops = operations(settings, database, check)
    ops.unload(name)
    assert states(another_process, name) == {"1": ("UNAVAILABLE", "unloaded by an operator")}
    loaded = ops.load(name)
    assert seen == [(("LOADING", CHECKING), [])]  # committed, and not serving meanwhile
    assert [(s.version, s.state) for s in loaded] == [("1", "READY")]
    assert states(another_process, name) == {"1": ("READY", "")}
    assert another_process.versions(name) == ["1"]


@pytest.mark.usefixtures("scope")
def test_a_serving_version_serves_on_while_a_load_checks_it_again(
    settings: Settings, database: Database, another_process: ModelRepository
) -> None:
    """As Triton reloads a READY model in the background: no LOADING, no gap."""
    name = copy_model(settings.model_repository)
    seen: list[tuple[tuple[str, str], list[str]]] = []

    def check(card: ModelCard) -> None:
        seen.append((states(another_process, name)[card.version], another_process.versions(name)))
        check_loadable(card)

    ops = operations(settings, database, check)
    ops.load(name)
    seen.clear()
    ops.load(name)
    assert seen == [(("READY", ""), ["1"])]


@pytest.mark.usefixtures("scope")
def test_a_failed_check_and_an_unfinished_load_leave_no_version_loading(
    settings: Settings, database: Database, another_process: ModelRepository
) -> None:
    name = copy_model(settings.model_repository, ("1", "2"))
    (settings.model_repository / name / "2" / "model.onnx").write_bytes(b"\x00corrupt")
    ops = operations(settings, database, check_loadable)
    with pytest.raises(InvalidModel, match="version 2"):
        ops.load(name)
    found = states(another_process, name)
    assert found["1"] == ("READY", "") and found["2"][0] == "UNAVAILABLE"
    assert "not an ONNX model" in found["2"][1]

    def crashes(card: ModelCard) -> None:
        raise MemoryError("the machine ran out")  # not a verdict on the model

    ops.unload(name)
    with pytest.raises(MemoryError):
        operations(settings, database, crashes).load(name)
    for state, reason in states(another_process, name).values():
        assert state == "UNAVAILABLE" and "the load did not finish: MemoryError" in reason


@pytest.mark.usefixtures("scope")
def test_a_config_is_written_into_every_card_and_read_back_as_the_configuration(
    settings: Settings, database: Database, another_process: ModelRepository
) -> None:
    name = copy_model(settings.model_repository, ("1", "2"))
    config = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "dynamic_batching": {"max_queue_delay_microseconds": "500"},  # int64 as protobuf writes
        "version_policy": {"latest": {"num_versions": 1}},
        "parameters": {"owner": {"string_value": "research"}},
        "instance_group": [],  # a field left at its default is taken
    }
    loaded = operations(settings, database, check_loadable).load(
        name, {"config": json.dumps(config)}
    )
    assert [(s.version, s.state) for s in loaded] == [("1", "UNAVAILABLE"), ("2", "READY")]
    assert "version_policy" in loaded[0].reason
    for version in ("1", "2"):
        card = raw_card(settings, name, version)
        assert card["batching"]["max_batch_size"] == 8
        assert card["batching"]["max_queue_delay_ms"] == 0.5
        assert card["batching"]["why"] and card["metrics"]  # the rest of the card is kept
        assert card["version_policy"] == {"latest": 1}
        assert card["parameters"] == {"owner": "research"}
        left = [p.name for p in (settings.model_repository / name / version).iterdir()]
        assert sorted(left) == ["card.json", "model.onnx"]  # no staged file left behind
    shown = model_config(another_process.resolve(name))
    assert shown["max_batch_size"] == 8
    assert shown["dynamic_batching"] == {"max_queue_delay_microseconds": 500}
    assert shown["version_policy"] == {"latest": {"num_versions": 1}}
    assert shown["parameters"] == {"owner": {"string_value": "research"}}
    assert another_process.versions(name) == ["2"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ("not json", "config is not JSON"),
        ('["a list"]', "config must be a JSON object"),
        ({"name": "digits"}, "config.name"),
        ({"platform": "tensorrt_plan"}, "config.platform"),
        ({"max_batch_size": -1}, "config.max_batch_size"),
        ({"max_batch_size": "many"}, "config.max_batch_size"),
        ({"dynamic_batching": {"preferred_batch_size": [4, 8]}}, "preferred_batch_size"),
        ({"dynamic_batching": {"max_queue_delay_microseconds": 2_000_000}}, "at most 1000000"),
        ({"max_batch_size": 0, "dynamic_batching": {}}, "needs max_batch_size > 0"),
        ({"instance_group": [{"kind": "KIND_GPU", "count": 2}]}, "config.instance_group"),
        ({"sequence_batching": {"max_sequence_idle_microseconds": 5}}, "sequence_batching"),
        ({"input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [32]}]}, "config.input"),
        ({"version_policy": {"newest": 1}}, "config.version_policy"),
        ({"version_policy": {"latest": {"num_versions": 0}}}, "config.version_policy.latest"),
        ({"parameters": {"k": "v"}}, "config.parameters.k"),
        ({"model_transaction_policy": {"decoupled": True}}, "decoupled"),
    ],
)
@pytest.mark.usefixtures("scope")
def test_a_config_the_cards_cannot_honour_is_refused_and_nothing_written(
    settings: Settings, database: Database, another_process: ModelRepository,
    config: Any, field: str,
) -> None:  # fmt: skip
    name = copy_model(settings.model_repository)
    ops = operations(settings, database, check_loadable)
    ops.load(name)
    before = (settings.model_repository / name / "1" / "card.json").read_bytes()
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(InvalidParameter) as refused:
        ops.load(name, {"config": text})
    assert field in refused.value.detail
    assert refused.value.code == "invalid-parameter"
    assert (settings.model_repository / name / "1" / "card.json").read_bytes() == before
    assert states(another_process, name) == {"1": ("READY", "")}


def test_a_batch_dimension_needs_a_free_first_dimension(settings: Settings) -> None:
    """The chat model's tensors are [1]: it cannot batch along them."""
    chat = ModelCard.load(settings.model_repository / "smollm2" / "1")
    with pytest.raises(InvalidParameter, match=r"config.max_batch_size.*text_input \[1\]"):
        parse_config("smollm2", json.dumps({"max_batch_size": 4}), [chat])
    same = parse_config("smollm2", json.dumps(model_config(chat)), [chat])
    assert same.max_batch_size == 0 and same.max_queue_delay_ms is None


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"file:1/model.onnx": b"\x08\x01"}, "not supported; PUT the file"),
        ({"config": 5}, "'config' must be a string"),
        ({"poll": True}, "unrecognized load parameter 'poll'"),
    ],
)
@pytest.mark.usefixtures("scope")
def test_load_parameters_triton_defines_and_others(
    settings: Settings, database: Database, parameters: dict[str, Any], message: str
) -> None:
    name = copy_model(settings.model_repository)
    with pytest.raises(InvalidParameter, match=message):
        operations(settings, database, check_loadable).load(name, parameters)


@pytest.mark.usefixtures("scope")
def test_unload_takes_a_boolean_unload_dependents(
    settings: Settings, database: Database, another_process: ModelRepository
) -> None:
    name = copy_model(settings.model_repository)
    ops = operations(settings, database, check_loadable)
    for wrong in ("true", 1, None):
        with pytest.raises(InvalidParameter, match="must be a boolean"):
            ops.unload(name, parameters={"unload_dependents": wrong})
    with pytest.raises(InvalidParameter, match="unrecognized unload parameter"):
        ops.unload(name, parameters={"dependents": True})
    assert another_process.versions(name) == ["1"]  # none of those unloaded it
    ops.unload(name, parameters={"unload_dependents": True})  # no dependents: the model alone
    assert states(another_process, name) == {"1": ("UNAVAILABLE", "unloaded by an operator")}


def test_the_command_line_loads_with_a_config_and_unloads(
    settings: Settings, another_process: ModelRepository
) -> None:
    name = copy_model(settings.model_repository)
    env = service_env(settings)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["models", *args], env=env, catch_exceptions=False)

    unloaded = run("unload", name)
    assert unloaded.exit_code == 0, unloaded.output
    assert f"{name}:1\tUNAVAILABLE\tunloaded by an operator" in unloaded.output
    assert another_process.versions(name) == []
    loaded = run("load", name, "--config", '{"max_batch_size": 4}')
    assert loaded.exit_code == 0, loaded.output
    assert f"{name}:1\tREADY" in loaded.output
    assert raw_card(settings, name)["batching"]["max_batch_size"] == 4
    assert another_process.versions(name) == ["1"]
    refused = run("load", name, "--config", '{"name": "digits"}')
    assert refused.exit_code != 0 and "config.name" in refused.output
    missing = run("unload", "no-such-model")
    assert missing.exit_code != 0 and "not in the repository" in missing.output
