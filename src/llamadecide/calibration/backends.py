"""Where answers come from: the local engine, a running server (or any compatible endpoint) by
URL, or a SageMaker endpoint by name. Each returns per-option log-likelihoods for one item; the
local engine also gives token counts (needed for length normalisation)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from llamadecide.calibration.config import head_layer
from llamadecide.decisions import Question, Scoring
from llamadecide.decisions.maths import CONTENT_FREE_INPUTS
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.engine.model_files import measured_head_depth
from llamadecide.errors import LlamaDecideError


@dataclass(frozen=True)
class ItemScores:
    logprobs: list[float]
    n_tokens: list[int] | None
    hidden: np.ndarray | None = None  # hidden state at the answer position (local engine only)


PLAIN = Scoring()  # the state-first prompt, no demonstrations, one rotation


class Backend(Protocol):
    """What calibration reads of a model. `rule` is the prompt a variant asks in (its format,
    demonstrations and rotations; `Scoring.raw`): answers come back raw."""

    description: str
    supports_hidden: bool
    supports_demonstrations: bool

    def identity(self) -> str: ...
    def head_layer(self, depth: float | None) -> int | None:
        """The block a head reads at `depth` (`config.head_layer`; None: the model's measured depth),
        None for the final state or where no hidden state is read."""

    def score(
        self,
        text: str,
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> ItemScores: ...
    def content_free(self, question: Question, rule: Scoring = PLAIN) -> tuple[np.ndarray, np.ndarray | None]: ...
    def score_many(
        self,
        texts: list[str],
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        answers: bool = True,
    ) -> list[ItemScores]: ...


class LocalBackend:
    supports_hidden = True
    supports_demonstrations = True

    def __init__(self, engine) -> None:
        self.engine = engine
        self.measurer = Measurer(engine)
        self.description = f"local engine: {engine.model_path.name}"

    def identity(self) -> str:
        return self.engine.model_sha256

    def head_layer(self, depth: float | None) -> int | None:
        if depth is None:
            depth = measured_head_depth(self.engine.model_sha256)
        layer = head_layer(self.engine.n_layer, depth)
        return layer if layer in self.engine.readable_layers else None

    def score(
        self,
        text: str,
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> ItemScores:
        return ItemScores(*self.measurer.scores(text, question, rule, hidden=hidden, hidden_layer=hidden_layer))

    def cost(self, text: str, question: Question, rule: Scoring = PLAIN) -> tuple[float, float]:
        """Evaluated rows per item like `text`, (answers, hidden state alone), each row weighted by the
        pinned prefix it attends to (on the CPU a row over a 3,000-token prefix costs about three)."""
        answer_rows, prompt_rows, pinned = self.measurer.cost(text, question, rule.raw())
        weight = 1.0 + pinned / 1500
        return answer_rows * weight, prompt_rows * weight

    def score_many(
        self,
        texts: list[str],
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        answers: bool = True,
    ) -> list[ItemScores]:
        """Many items in shared engine calls, each scored as alone. Without `answers`, only the hidden
        state (no answer is scored; `logprobs` empty)."""
        if not answers:
            return [
                ItemScores([], None, state)
                for state in self.measurer.hidden_many(texts, question, rule, layer=hidden_layer)
            ]
        scored = self.measurer.scores_many(texts, question, rule, hidden=hidden, hidden_layer=hidden_layer)
        return [ItemScores(logprobs, lengths, state) for logprobs, lengths, state in scored]

    def content_free(self, question: Question, rule: Scoring = PLAIN) -> tuple[np.ndarray, np.ndarray | None]:
        return self.measurer.content_free_scores(question, rule)


def wire_question(question: Question) -> dict[str, Any]:
    """A decisions Question as an OpenAI Decisions question."""
    if question.type == "predicate":
        return {"type": "predicate", "instructions": question.instructions}
    if question.type == "score":
        return {
            "type": "score",
            "instructions": question.instructions,
            "levels": [
                {"label": o.text, **({"description": o.description} if o.description else {})} for o in question.options
            ],
        }
    return {
        "type": "choice",
        "instructions": question.instructions,
        "choices": [
            {"value": o.value, **({"description": o.description} if o.description else {})} for o in question.options
        ],
    }


def _logprobs_from_answer(answer: dict, question: Question) -> ItemScores:
    if answer.get("type") == "refusal":
        raise LlamaDecideError("the endpoint refused the question")
    if question.type == "predicate":
        p = float(answer["probability"])
        probs = [p, 1.0 - p]
    else:
        by_value = {json.dumps(item["value"]): float(item["probability"]) for item in answer["probabilities"]}
        keys = [json.dumps(o.value) for o in question.options]
        probs = [by_value[k] for k in keys]
    return ItemScores([float(np.log(max(p, 1e-300))) for p in probs], None)


class _RemoteBackend:
    supports_hidden = False
    supports_demonstrations = False

    def __init__(self) -> None:
        self._identity: str | None = None

    def close(self) -> None:
        """Release the connection (local backends hold none)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _body(self, text: str, question: Question, rotations: int = 1) -> dict:
        extension: dict[str, Any] = {"mode": question.mode}
        if rotations > 1:
            extension["rotations"] = rotations
        return {"model": "default", "input": text, "questions": [wire_question(question)], "llamadecide": extension}

    def _post(self, body: dict) -> dict:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def identity(self) -> str:
        if self._identity is None:
            probe = self._post(
                {
                    "model": "default",
                    "input": "probe",
                    "questions": [{"type": "predicate", "instructions": "This is a probe."}],
                }
            )
            ext = probe.get("llamadecide") or {}
            self._identity = ext.get("model_sha256") or f"{self.description}|{probe.get('model')}"
            if ext.get("prompt_format") not in (None, PROMPT_FORMAT_VERSION):
                raise LlamaDecideError(
                    f"the endpoint uses prompt format {ext['prompt_format']!r}, this tool {PROMPT_FORMAT_VERSION!r}"
                )
        return self._identity

    def head_layer(self, depth: float | None) -> int | None:
        return None  # no hidden state is read through an endpoint

    def score(
        self,
        text: str,
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> ItemScores:
        if hidden:
            raise LlamaDecideError(
                f"{self.description} does not expose hidden states; fit heads with the local backend"
            )
        if rule.demonstrations:
            raise LlamaDecideError(f"{self.description} takes no demonstrations; fit k-shot with the local backend")
        if rule.prompt_format != PROMPT_FORMAT_VERSION:
            raise LlamaDecideError(
                f"{self.description} asks every question in {PROMPT_FORMAT_VERSION!r}; "
                f"measure {rule.prompt_format!r} with the local backend"
            )
        return _logprobs_from_answer(self._post(self._body(text, question, rule.rotations))["answers"][0], question)

    def score_many(
        self,
        texts: list[str],
        question: Question,
        rule: Scoring = PLAIN,
        *,
        hidden: bool = False,
        hidden_layer: int | None = None,
        answers: bool = True,
    ) -> list[ItemScores]:
        """One request per item (the endpoint shares its own engine calls under load)."""
        return [self.score(text, question, rule, hidden=hidden) for text in texts]

    def content_free(self, question: Question, rule: Scoring = PLAIN) -> tuple[np.ndarray, np.ndarray | None]:
        """The endpoint's answers on content-free inputs (normalised log-probabilities: the prior is
        the same whether or not they were normalised)."""
        return np.asarray([self.score(text, question, rule).logprobs for text in CONTENT_FREE_INPUTS]), None


class HTTPBackend(_RemoteBackend):
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        import httpx

        super().__init__()
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.description = f"endpoint {self.url}"

    def close(self) -> None:
        self.client.close()

    def _post(self, body: dict) -> dict:
        response = self.client.post("/v1/decisions", json=body)
        if response.status_code != 200:
            raise LlamaDecideError(f"{self.url} answered {response.status_code}: {response.text[:300]}")
        return response.json()


class SageMakerBackend(_RemoteBackend):
    def __init__(self, endpoint: str, region: str | None = None, client: Any = None) -> None:
        super().__init__()
        if client is None:
            from llamadecide.aws import import_boto3

            client = import_boto3().client("sagemaker-runtime", region_name=region)
        self.endpoint = endpoint
        self.client = client
        self.description = f"SageMaker endpoint {endpoint}"

    def _post(self, body: dict) -> dict:
        response = self.client.invoke_endpoint(
            EndpointName=self.endpoint,
            ContentType="application/json",
            Accept="application/json",
            CustomAttributes="route=/v1/decisions",
            Body=json.dumps(body).encode(),
        )
        return json.loads(response["Body"].read())


def backend_from(spec: str | None, *, engine_factory, api_key: str | None = None) -> Backend:
    """`local` (default), an http(s):// URL, or sagemaker:ENDPOINT[@REGION]."""
    if not spec or spec == "local":
        return LocalBackend(engine_factory())
    if spec.startswith(("http://", "https://")):
        return HTTPBackend(spec, api_key)
    if spec.startswith("sagemaker:"):
        name, _, region = spec[len("sagemaker:") :].partition("@")
        return SageMakerBackend(name, region or None)
    raise LlamaDecideError(f"unknown backend {spec!r}: use local, an http(s) URL, or sagemaker:ENDPOINT[@REGION]")
