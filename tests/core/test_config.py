"""pipeline.core.config: params read as DVC reads YAML, sections found in the code, and strict,
frozen config models whose every error is one line naming the key, the value and what is
allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from pipeline.core import config
from pipeline.core.config import (
    ParamsError,
    RuntimeConfig,
    StageConfig,
    check_all,
    load_runtime,
    load_section,
    parse_section,
    parse_yaml,
    read_params,
    section_class,
    sections,
)


class Inner(StageConfig):
    depth: int = 1
    rate: float = 0.5


class Toy(StageConfig):
    size: int = Field(3, ge=1)
    name: str
    inner: Inner = Inner()


def _error(raw, cls=Toy, name: str = "toy") -> str:
    with pytest.raises(ParamsError) as e:
        parse_section(name, raw, cls)
    return str(e.value)


def test_yaml_is_read_as_dvc_reads_it() -> None:
    """YAML 1.2: the words PyYAML turns into booleans stay strings; exponents are numbers."""
    assert parse_yaml("a: off\nb: on\nc: yes\nd: 1e-3\ne: true\n") == {
        "a": "off", "b": "on", "c": "yes", "d": 0.001, "e": True}


def test_read_params_parses_once_yet_never_serves_a_stale_or_shared_copy(tmp_path, monkeypatch):
    calls = []
    parse = config.parse_yaml
    monkeypatch.setattr(config, "parse_yaml", lambda text: calls.append(1) or parse(text))
    path = tmp_path / "params.yaml"
    path.write_text("ingest:\n  min_notes: 3\n", encoding="utf-8")
    first = read_params(path)
    first["ingest"]["min_notes"] = 99  # a caller's change stays its own
    assert read_params(path) == {"ingest": {"min_notes": 3}} and len(calls) == 1
    path.write_text("ingest:\n  min_notes: 4\n", encoding="utf-8")  # same path, new content
    assert read_params(path) == {"ingest": {"min_notes": 4}} and len(calls) == 2


def test_sections_are_found_in_the_code_and_a_claimed_section_is_refused(tmp_path: Path) -> None:
    """Each config class declares its section; the table is read from the files, so a new
    stage's section needs no registration elsewhere."""
    found = sections()
    assert found["ingest"] == "pipeline.music.manifest:IngestConfig"
    assert found["runtime"] == "pipeline.core.config:RuntimeConfig"
    assert all(name == section_class(name).SECTION for name in found)
    pkg = tmp_path / "pipeline" / "stages"
    pkg.mkdir(parents=True)
    (pkg / "toy.py").write_text('class ToyConfig(StageConfig):\n    """doc"""\n\n'
                                '    SECTION: ClassVar[str] = "toy"\n    size: int = 1\n')
    assert sections(tmp_path / "pipeline") == {"toy": "pipeline.stages.toy:ToyConfig"}
    (pkg / "toy2.py").write_text('class Toy2Config(StageConfig):\n'
                                 '    SECTION: ClassVar[str] = "toy"\n')
    sections.cache_clear()
    with pytest.raises(ValueError, match=r"section .toy. is already pipeline\.stages\.toy"):
        sections(tmp_path / "pipeline")
    sections.cache_clear()


def test_a_quoted_number_is_refused_and_a_float_field_takes_an_int() -> None:
    """``dvc exp run -S toy.size=042`` writes the string '042': refused, not read as 42."""
    assert _error({"size": "042", "name": "a"}) == (
        "params.yaml: toy.size = '042': Input should be a valid integer (a quoted or "
        "zero-padded number is a string: write a plain number)")
    cfg = parse_section("toy", {"name": "a", "inner": {"rate": 2}}, Toy)
    assert cfg.inner.rate == 2.0 and isinstance(cfg.inner.rate, float)
    assert "toy.name = 5: Input should be a valid string" in _error({"name": 5})


def test_unknown_and_missing_keys_name_the_key_and_what_is_allowed() -> None:
    assert _error({"name": "a", "typo": 1}) == (
        "params.yaml: toy.typo = 1: unknown key; allowed keys here: inner, name, size")
    assert _error({"name": "a", "inner": {"dept": 2}}, name="sec") == (
        "params.yaml: sec.inner.dept = 2: unknown key; allowed keys here: depth, rate")
    # every problem is its own line, in order
    assert _error({"size": 0}).splitlines() == [
        "params.yaml: toy.size = 0: Input should be greater than or equal to 1",
        "params.yaml: toy.name = '<missing>': required key is missing"]


def test_a_section_must_be_a_mapping_and_an_empty_one_takes_the_defaults() -> None:
    assert parse_section("runtime", None, RuntimeConfig) == RuntimeConfig()
    msg = _error([1, 2], RuntimeConfig, "runtime")
    assert msg == "params.yaml: runtime = [1, 2]: must be a mapping of keys to values"


def test_configs_are_frozen() -> None:
    cfg = parse_section("toy", {"name": "a"}, Toy)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.size = 4


@pytest.mark.parametrize(("workers", "lines"), [
    (0, ["runtime.workers = 0: Value error, must be 'auto' or an integer >= 1"]),
    # a union's members are not named in the key; each member's complaint is a line
    (1.5, ["runtime.workers = 1.5: Input should be a valid integer",
           "runtime.workers = 1.5: Input should be 'auto'"]),
])
def test_runtime_workers_are_auto_or_positive(workers, lines) -> None:
    msg = _error({"workers": workers}, RuntimeConfig, "runtime")
    assert msg.splitlines() == [f"params.yaml: {line}" for line in lines]
    assert RuntimeConfig(workers=3).n_workers() == 3
    assert RuntimeConfig().n_workers() >= 1
    assert "runtime.torch_threads" in _error({"torch_threads": 0}, RuntimeConfig, "runtime")


def test_load_runtime_validates_a_workers_override_like_the_file(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("runtime:\n  workers: 1\n  progress: false\n")
    assert load_runtime(params).workers == 1
    assert load_runtime(params, "3") == RuntimeConfig(workers=3, progress=False)
    assert load_runtime(params, "auto").workers == "auto"
    with pytest.raises(ParamsError, match=r"^--workers: runtime\.workers = 0: "):
        load_runtime(params, "0")


@pytest.mark.parametrize(("text", "message"), [
    (None, "file not found (pass --params FILE or run from the repo root)"),
    ("a: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "top level must be a mapping of sections, got list"),
    ("ingset:\n  max_notes: 5\n", "unknown section 'ingset'; allowed sections: "),
])
def test_read_params_refuses_a_file_it_cannot_use(tmp_path: Path, text, message) -> None:
    path = tmp_path / "params.yaml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ParamsError) as e:
        read_params(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


def test_load_section_and_check_all_read_only_the_sections_present(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("runtime:\n  workers: 2\ningest:\n  min_notes: 4\n", encoding="utf-8")
    assert load_section("runtime", path, RuntimeConfig).workers == 2
    found = check_all(path)
    assert sorted(found) == ["ingest", "runtime"]
    assert type(found["ingest"]) is section_class("ingest") and found["ingest"].min_notes == 4
    path.write_text("ingest:\n  min_notes: '4'\n", encoding="utf-8")
    with pytest.raises(ParamsError, match=rf"^{path}: ingest\.min_notes = '4'"):
        check_all(path)
