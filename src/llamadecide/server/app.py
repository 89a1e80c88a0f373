"""The FastAPI app factory. App state lives on `app.state`, built in the lifespan; the model
loads in the background so /ping can answer (503, then 200) while it does."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI

from llamadecide.decisions import Decider
from llamadecide.decisions.measuring import Measurer
from llamadecide.engine import Engine
from llamadecide.errors import ModelLoadError, UnsupportedError
from llamadecide.server.auth import check_key
from llamadecide.server.chat_serving import ChatServing
from llamadecide.server.decision_serving import DecisionServing
from llamadecide.server.errors import install_error_handlers
from llamadecide.server.metrics import Metrics, MetricsMiddleware
from llamadecide.server.middleware import BodyMiddleware
from llamadecide.server.problog import ProbabilityLog
from llamadecide.server.review_serving import ReviewServing
from llamadecide.server.routes import router
from llamadecide.server.sagemaker_routes import router as sagemaker_router
from llamadecide.server.scheduler import EngineScheduler
from llamadecide.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Services:
    engine: Engine
    model_name: str
    decisions: DecisionServing
    chat: ChatServing


class Runtime:
    """Everything a request needs, attached to app.state.runtime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scheduler = EngineScheduler(
            settings.queue_size, time_limit=settings.request_timeout or None, batch_size=settings.decision_batch
        )
        self.metrics = Metrics(
            lambda: self.scheduler.depth,
            engine_counters=lambda: self.services.engine.counters if self.services else None,
        )
        self.problog = ProbabilityLog(settings.probability_log) if settings.probability_log else None
        self.services: Services | None = None
        self.load_error: str | None = None
        self.profile_store = None  # calibration.profile_store.ProfileStore, when profiles_dir is set
        # The label store and its review queue, when label_store is set (before the model loads:
        # labels are taken while it does).
        self.reviews: ReviewServing | None = review_serving(settings) if settings.label_store else None
        self.metrics.register_reviews(lambda: self.review_figures())
        self._alerted: dict[str, str] = {}  # profile -> the version last warned about

    def served_profiles(self) -> list:
        return list(self.profile_store.profiles.values()) if self.profile_store else []

    def review_figures(self) -> dict | None:
        """Pending reviews and labels per profile, and each served profile's audit (None without a store)."""
        if self.reviews is None:
            return None
        return {"counts": self.reviews.store.counts(), "audits": self.reviews.audits(self.served_profiles())}

    def refuse_without_store(self) -> ReviewServing:
        if self.reviews is None:
            raise UnsupportedError(
                "this server keeps no labels: start it with a label store (label_store, LLAMADECIDE_LABEL_STORE)",
                param="label_store",
            )
        return self.reviews

    def upkeep(self, now: float) -> None:
        """What the server looks after between requests: new or changed profiles, and the retention
        of queued inputs."""
        if self.profile_store is not None and self.settings.profiles_poll > 0:
            for change in self.profile_store.refresh():
                log.info("calibration profiles: %s", change)
        if self.reviews is not None and self.settings.review_retention_days > 0:
            forgotten = self.reviews.store.forget_inputs(now - self.settings.review_retention_days * 86400)
            if forgotten:
                log.info("label store: erased the input of %d items past the retention", forgotten)
        for found in self.review_figures()["audits"] if self.reviews is not None else ():
            if found.state == "below_target" and self._alerted.get(found.profile) != found.version:
                log.warning(
                    "profile %s: audited precision %.3f, lower bound %.3f below the target %.2f (%d audited labels)",
                    found.profile,
                    found.precision,
                    found.lower_bound,
                    found.target,
                    found.labels,
                )
                self._alerted[found.profile] = found.version

    def attach(self, engine: Engine) -> None:
        name = self.settings.model_alias or engine.model_name
        log.info(
            "engine: n_ctx %d, flash attention %s, scoring %s in calls of up to %d rows",
            engine.n_ctx,
            "on" if engine.config.flash_attn else "off",
            "deterministic" if engine.config.deterministic else "NOT deterministic",
            engine.call_rows,
        )
        profiles = None
        if self.settings.profiles_dir:
            from llamadecide.calibration.profile_store import ProfileStore
            from llamadecide.decisions.prompt import PROMPT_FORMATS

            store = ProfileStore(
                self.settings.profiles_dir,
                engine.model_sha256,
                PROMPT_FORMATS,
                check=lambda profile: fits_context(Measurer(engine), profile, engine),
            )
            profiles = store.get
            self.profile_store = store
            log.info("calibration profiles loaded: %s", ", ".join(store.profiles) or "none")
        decisions = DecisionServing(
            Decider(engine, max_bound=self.settings.max_probability_bound),
            model_name=name,
            max_questions=self.settings.max_questions,
            max_options=self.settings.max_options,
            model_sha256=lambda: engine.model_sha256,
            profiles=profiles,
            systemone_extensions=self.settings.systemone_extensions,
            max_request_rows=self.settings.max_request_rows,
            max_rotations=self.settings.max_rotations,
            on_batch=self.metrics.batch_decisions.observe,
        )
        chat = ChatServing(engine, self.scheduler, model_name=name, max_tokens=self.settings.max_tokens)
        self.services = Services(engine, name, decisions, chat)

    def ready(self) -> Services:
        if self.services is None:
            detail = f": {self.load_error}" if self.load_error else " yet"
            raise ModelLoadError(f"the model is not loaded{detail}")
        return self.services


def review_serving(settings: Settings) -> ReviewServing:
    """The label store the settings name, its review queue, and A2I human loops when a flow is set."""
    from llamadecide.labels.queue import ReviewQueue
    from llamadecide.labels.store import open_store

    store = open_store(settings.label_store)
    on_queued = None
    if settings.a2i_flow_definition:
        from llamadecide.labels.a2i import HumanLoops

        on_queued = HumanLoops(settings.a2i_flow_definition).start
    return ReviewServing(store, ReviewQueue(store, settings.audit_rate, on_queued=on_queued))


MIN_INPUT_TOKENS = 64  # what a profile must leave room for beside its question, at the least


def fits_context(measurer: Measurer, profile, engine: Engine) -> str | None:
    """Whether a profile's question, with its pinned prefix, leaves room for an input in the context;
    logs the prefix it pins. Returns the reason it cannot be served, if so."""
    try:
        pinned, needed = measurer.footprint(profile.question(), profile.scoring())
    except Exception as exc:  # noqa: BLE001 - a profile the library cannot even tokenize is not served
        return f"its question cannot be asked: {exc}"
    if needed + MIN_INPUT_TOKENS > engine.max_sequence:
        return (
            f"its prompt and answers need {needed} tokens before any input (a pinned prefix of {pinned}); with "
            f"room for a {MIN_INPUT_TOKENS}-token input that is more than this context holds "
            f"({engine.max_sequence}): "
            f"raise n_ctx to at least {needed + MIN_INPUT_TOKENS + engine.n_ctx - engine.max_sequence}"
        )
    if pinned:
        log.info(
            "profile %s pins a %d-token question prefix (%d of %d context tokens left for its inputs)",
            profile.name,
            pinned,
            engine.max_sequence - needed,
            engine.max_sequence,
        )
    return None


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    engine_factory: Callable[[Settings], Engine] | None = None,
    on_load_error: Callable[[str], None] | None = None,
) -> FastAPI:
    """`engine` serves a model already loaded (tests); otherwise `engine_factory` (default:
    Engine(settings.engine_config())) runs in the background at start-up. A model that cannot load
    is reported by /ping and every route (`app.state.runtime.load_error`), and passed to
    `on_load_error` (the serve commands stop the server with it)."""
    settings = settings or Settings()
    runtime = Runtime(settings)
    factory = engine_factory or (lambda s: Engine(s.engine_config()))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = None
        if engine is not None:
            runtime.attach(engine)
        else:

            async def load() -> None:
                try:
                    loaded = await asyncio.get_running_loop().run_in_executor(None, factory, settings)
                    runtime.attach(loaded)
                    log.info("model loaded: %s", loaded.model_path)
                except Exception as exc:  # reported by /ping and every route, never raised into the loop
                    runtime.load_error = str(exc)
                    log.error("model failed to load: %s", exc)
                    if on_load_error is not None:
                        on_load_error(str(exc))

            task = asyncio.create_task(load())
        upkeep = asyncio.create_task(_upkeep(runtime))
        try:
            yield
        finally:
            upkeep.cancel()
            if task is not None:
                task.cancel()
            runtime.scheduler.shutdown()
            if runtime.problog:
                runtime.problog.close()
            if runtime.reviews is not None:
                runtime.reviews.store.close()

    # /openapi.json is always there (plain JSON); the Swagger UI page at /docs loads its scripts from a
    # CDN, which an offline or private deployment cannot reach, so it is off unless asked for.
    app = FastAPI(
        title="llamadecide",
        version=_version(),
        lifespan=lifespan,
        docs_url="/docs" if settings.swagger_ui else None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.runtime = runtime
    install_error_handlers(app)

    app.include_router(router, dependencies=[Depends(check_key)])
    app.include_router(sagemaker_router, dependencies=[Depends(check_key)])
    # Added last runs first: metrics see every response, the body limit's 413s included.
    app.add_middleware(BodyMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=runtime.metrics)
    return app


UPKEEP_IDLE_S = 60.0  # between looks when profiles are not polled


async def _upkeep(runtime: Runtime) -> None:
    """`Runtime.upkeep` every `profiles_poll` seconds, off the event loop; a failure is logged, never raised."""
    poll = runtime.settings.profiles_poll or UPKEEP_IDLE_S
    while True:
        await asyncio.sleep(poll)
        try:
            await asyncio.to_thread(runtime.upkeep, time.time())
        except Exception:  # noqa: BLE001 - the server goes on serving what it has
            log.exception("upkeep failed (profiles, retention, audits)")


def _version() -> str:
    from llamadecide import __version__

    return __version__
