"""The profiles a server serves from a directory, one version per name, refreshed when the directory
changes (a refit's new version) without a restart."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from llamadecide.calibration.profile import CalibrationProfile, profile_files
from llamadecide.errors import InvalidRequestError, ModelLoadError, ProfileMismatchError

log = logging.getLogger(__name__)


class ProfileStore:
    """The profiles of a directory (`profile_files`), one version per name: the highest (then the
    latest created). A file that is not a valid profile, or one bound to another model or an unknown
    prompt format, is left out with its reason logged and reported to any request naming it: one bad
    file never keeps the model from serving the others. `refresh` takes in what changed in the
    directory since (a refit's new version) without a restart."""

    def __init__(
        self,
        directory: Path,
        model_sha256: str,
        prompt_formats: tuple[str, ...],
        *,
        check: Callable[[CalibrationProfile], str | None] | None = None,
    ) -> None:
        """`check` may refuse a profile the server cannot serve (it returns the reason)."""
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ModelLoadError(f"profiles directory {directory} does not exist")
        self.model_sha256, self.prompt_formats, self.check = model_sha256, prompt_formats, check
        self.profiles: dict[str, CalibrationProfile] = {}
        self.refused: dict[str, str] = {}  # file -> why it is not served
        self.superseded: dict[str, str] = {}  # file -> the version served instead
        self._loaded: dict[Path, tuple[tuple[int, int], CalibrationProfile | str]] = {}
        self.refresh()

    def refresh(self) -> list[str]:
        """Read the directory again (only the files that changed); returns what changed in what is
        served, one line each (empty: nothing)."""
        loaded: dict[Path, tuple[tuple[int, int], CalibrationProfile | str]] = {}
        for path in profile_files(self.directory):
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while listed
            signature = (stat.st_mtime_ns, stat.st_size)
            held = self._loaded.get(path)
            loaded[path] = held if held and held[0] == signature else (signature, self._load(path))
        profiles: dict[str, CalibrationProfile] = {}
        where: dict[str, Path] = {}
        refused, superseded = {}, {}
        for path, (_, found) in loaded.items():
            if isinstance(found, str):
                refused[str(path)] = found
                continue
            held = profiles.get(found.name)
            if held is not None and (held.version, held.created) >= (found.version, found.created):
                superseded[str(path)] = f"version {found.version}; serving version {held.version}"
                continue
            if held is not None:
                superseded[str(where[found.name])] = f"version {held.version}; serving version {found.version}"
            profiles[found.name], where[found.name] = found, path
        changes = [
            f"{name}: serving version {p.version} ({p.version_id})"
            for name, p in profiles.items()
            if name not in self.profiles or self.profiles[name].version_id != p.version_id
        ] + [f"{name}: no longer served" for name in self.profiles if name not in profiles]
        self._loaded = loaded
        self.profiles, self.refused, self.superseded = profiles, refused, superseded
        return changes

    def _load(self, path: Path) -> CalibrationProfile | str:
        """The profile in a file, or why it is not served."""
        try:
            profile = CalibrationProfile.load(path)
            profile.check_bound_to(self.model_sha256, self.prompt_formats)
            problem = self.check(profile) if self.check is not None else None
            if problem:
                raise ProfileMismatchError(problem)
        except (ValueError, OSError, ProfileMismatchError) as exc:
            reason = _reason(exc)
            log.error("calibration profile %s is not served: %s", path, reason)
            return reason
        return profile

    def get(self, name: str) -> CalibrationProfile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none"
            refused = "".join(f"; not served: {path} ({why})" for path, why in self.refused.items())
            raise InvalidRequestError(
                f"unknown calibration profile {name!r} (loaded: {known}{refused})", param="llamadecide.profile"
            ) from None


def _reason(exc: Exception) -> str:
    """One line: a validation error's first problem and where, or the error's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "file"
        return f"not a calibration profile: {where}: {first.get('msg')} ({len(errors())} errors)"
    return str(exc).splitlines()[0]
