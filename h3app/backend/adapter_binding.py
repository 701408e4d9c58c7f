"""Make the held transformer carry exactly a job's adapters: fetch, normalise (cached), attach, re-scale, detach.

Each job carries its complete adapter settings (docs/architecture.md, decision 7); :meth:`AdapterBinder.apply` turns the
engine's current state into the job's with the fewest operations — an alpha/strength change on an adapter that is
already attached is a scalar update, a new file is fetched and attached, adapters the job does not name are
detached. If anything fails, every adapter is detached so the next job starts from the bitwise base.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ..adapters import source as sources
from ..adapters.inspect import inspect_header
from ..adapters.known import registry_identity
from ..adapters.normalise import load_adapter
from ..adapters.resolved import ResolvedAdapter, resolve_adapter
from ..adapters.types import AdapterInfo, NormalisedAdapter
from ..errors import H3AppError
from ..lora.cache import AdapterCache, AdapterKey
from ..lora.engine import LoRAEngine
from ..lora.report import MatchReport
from ..model import fp8, repo
from ..model.loader import LoadedModel, config_of
from ..rules.choices import MERGED, T2VA, UNMERGED
from ..rules.h3_modules import TransformerShapes, transformer_shapes
from ..settings import LoRASettings
from .access_ledger import AccessLedger

DEFAULT_CACHE_BYTES = 8 * 1024**3


@dataclass(frozen=True)
class SourcePolicy:
    """What adapter sources a server accepts. Hosted mode refuses local paths outside ``allowed_local_dirs``,
    caps remote file size, and never lends the server's own HF token to visitors."""

    hosted: bool = False
    allowed_local_dirs: tuple[str, ...] = ()
    max_remote_bytes: int | None = None
    unlisted_dirs: tuple[str, ...] = ()
    max_cache_bytes: int | None = None
    protected_repos: tuple[str, ...] = ()

    def check_source(self, source: str) -> None:
        """Hosted mode: a folder inside ``unlisted_dirs`` (the uploads) is never a source — listing it would show
        one visitor's uploads to another; each upload is reachable only by its own (unguessable) file path."""
        if not self.hosted or not self.unlisted_dirs:
            return
        path = Path(str(source)).expanduser()
        try:
            is_folder = path.is_dir()
            resolved = path.resolve()
        except (OSError, ValueError):
            return  # not a usable local path: parse_source gives the one-line answer
        for folder in self.unlisted_dirs:
            root = Path(folder).resolve()
            if is_folder and (resolved == root or root in resolved.parents):
                raise H3AppError("the uploads folder cannot be listed on this server: give the path of your uploaded "
                                 ".safetensors file, a Hub repo id or an HF URL.")

    def local_rule(self) -> dict[str, Any]:
        """Where a local source may be: hosted, only inside the allowed folders."""
        return {"allowed_local_dirs": list(self.allowed_local_dirs)} if self.hosted else {}

    def inspect(self, model_folder: str, source: str, weight_name: str | None, revision: str | None,
                token: str | None, workflow: str, qkv_layout: str, skip_parts: tuple[str, ...] = ()) -> AdapterInfo:
        """Header only (remote: HTTP ranges), checked against the shapes of ``workflow``'s transformer in
        ``model_folder`` (a file made for the other partition gets a warning; loading it is refused); no weights
        downloaded."""
        self.check_source(source)
        ref = sources.parse_source(source, weight_name, revision, **self.local_rule())
        view = sources.read_header(ref, None, None, self.token(token), **self.local_rule())  # ref has them
        partition = repo.partition_for(workflow)
        shapes = transformer_shapes(repo.read_transformer_config(model_folder, partition))
        repo_id, filename = registry_identity(str(ref.local_path or source), weight_name, ref.filename or view.name,
                                              repo_id=ref.repo_id)
        return inspect_header(view, shapes=shapes, repo_id=repo_id, filename=filename, qkv_layout=qkv_layout,
                              partition=partition, skip_parts=tuple(skip_parts))

    def fetch_kwargs(self) -> dict[str, Any]:
        if not self.hosted:
            return {}
        return {"allowed_local_dirs": list(self.allowed_local_dirs), "max_bytes": self.max_remote_bytes}

    def token(self, user_token: str | None) -> str | bool | None:
        """The token to send: the visitor's if given; in hosted mode never the server's own."""
        if user_token:
            return user_token
        return False if self.hosted else None


@dataclass(frozen=True)
class LoadedAdapter:
    """A fetched and normalised adapter file, with where it came from."""

    settings: LoRASettings
    file: sources.AdapterFile
    adapter: NormalisedAdapter
    config_version: tuple[int, int] | None = None  # adapter_config.json's (size, mtime_ns) when it was read

    def provenance(self) -> dict[str, Any]:
        """What the settings JSON records so that a result can be reproduced (``local``: a file on this machine,
        not from the Hub, which a hosted answer names by file name, ``outputs.names_only``)."""
        return {
            "source": self.settings.source,
            "local": self.file.repo_id is None,
            "weight_name": self.file.filename,
            "revision": self.settings.revision,
            "commit": self.file.commit,
            "sha256": self.file.sha256(),
            "format": self.adapter.info.format,
            "rank": self.adapter.info.rank,
            "stored_alpha": self.adapter.info.alpha,
            "alpha_source": str(self.adapter.info.alpha_source),
            "alpha": self.settings.alpha,
            "resolved_alpha": self.resolved.resolved_alpha,
            "resolved_alpha_source": str(self.resolved.alpha_source),
            "effective_scale": self.resolved.effective_scale,
            "strength": self.settings.strength,
            "group_strengths": dict(self.settings.group_strengths),
            **self.settings.advanced_json(),
            "mode": self.settings.mode,
            "resolved": self.resolved.to_json(),
            "parts": dict(self.adapter.info.parts),
            "partition": self.adapter.info.partition,
            "skipped_parts": dict(self.adapter.info.skipped_parts),
            "not_applied": self.adapter.info.not_applied.to_json(),
            "recipe": dict(self.adapter.info.recipe),
        }

    @cached_property
    def resolved(self) -> ResolvedAdapter:
        """What this adapter runs at with these settings (``adapters.resolved``): computed once, shown everywhere."""
        return resolve_adapter(self.adapter.info, self.settings.alpha, self.settings.strength,
                               self.settings.group_strengths)


def trim_hub_cache(max_bytes: int, *, keep_commits: Set[str | None] = frozenset(),
                   protected_repos: Sequence[str] = ()) -> int:
    """Hosted mode: keep the Hugging Face cache's adapter downloads under ``max_bytes`` by deleting the least
    recently used model-repo revisions (never ``keep_commits``, the file just fetched, nor ``protected_repos``, the
    loaded model). Returns the bytes freed. Already-loaded adapters live on in memory."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return 0
    candidates = [(revision.last_modified, revision.commit_hash, revision.size_on_disk)
                  for repo in info.repos if repo.repo_type == "model" and repo.repo_id not in protected_repos
                  for revision in repo.revisions if revision.commit_hash not in keep_commits]
    total = sum(repo.size_on_disk for repo in info.repos if repo.repo_type == "model"
                and repo.repo_id not in protected_repos)
    doomed: list[str] = []
    for _, commit, size in sorted(candidates):  # oldest first
        if total <= max_bytes:
            break
        doomed.append(commit)
        total -= size
    if not doomed:
        return 0
    strategy = info.delete_revisions(*doomed)
    strategy.execute()
    return strategy.expected_freed_size


def _config_version(file: sources.AdapterFile) -> tuple[int, int] | None:
    """Size and mtime (ns) of the ``adapter_config.json`` beside ``file`` (its alpha may change alone)."""
    if file.adapter_config_path is None:
        return None
    try:
        stat = file.adapter_config_path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def adapter_slot_name(settings: LoRASettings) -> str:
    """The engine name of an adapter: which file it is and what of it binds, not how strongly it is applied."""
    name = f"{settings.source}|{settings.weight_name or ''}|{settings.revision or ''}|{settings.qkv_layout}"
    if settings.skip_parts or settings.any_partition:  # what binds (and what was agreed to) is part of the name
        name += f"|skip={','.join(settings.skip_parts)}|any_partition={settings.any_partition}"
    return name


class AdapterBinder:
    """Owns one LoRA engine per transformer partition of a loaded model, plus the adapter cache."""

    def __init__(self, model: LoadedModel, *, policy: SourcePolicy | None = None,
                 cache: AdapterCache | None = None) -> None:
        self.model = model
        self.policy = policy or SourcePolicy()
        self.cache = cache if cache is not None else AdapterCache(DEFAULT_CACHE_BYTES)
        self._engines: dict[str, LoRAEngine] = {}
        self._files: dict[str, LoadedAdapter] = {}
        self._lock = threading.RLock()
        self.access = AccessLedger()  # hosted: who was shown allowed online, for offline answers

    def engine(self, workflow: str = T2VA) -> LoRAEngine:
        partition = repo.partition_for(workflow)
        with self._lock:
            if partition not in self._engines:
                device = self.model.options.device if self.model.options.offload != "none" else None
                self._engines[partition] = LoRAEngine(self.model.transformer(workflow), device=device)
            return self._engines[partition]

    def shapes(self, workflow: str = T2VA) -> TransformerShapes:
        return transformer_shapes(config_of(self.model.transformer(workflow)))

    def load(self, settings: LoRASettings, workflow: str = T2VA, token: str | None = None,
             progress: Callable[[int, int | None], None] | None = None) -> LoadedAdapter:
        """Fetch (only that file + json sidecars) and normalise ``settings``' adapter for ``workflow``'s
        partition, through the byte-budgeted cache."""
        return self._normalise(self._fetch(settings, token, progress), settings, workflow)

    def _fetch(self, settings: LoRASettings, token: str | None,
               progress: Callable[[int, int | None], None] | None = None) -> sources.AdapterFile:
        """What ``settings``' source names *now*: a branch resolved to its current commit, a local file as it is on
        disk (only what is missing is downloaded)."""
        self.policy.check_source(settings.source)
        file = sources.fetch(settings.source, settings.weight_name, settings.revision,
                             token=self.policy.token(token), progress=progress, **self.policy.fetch_kwargs())
        self._check_access(file, token)
        return file

    def _normalise(self, file: sources.AdapterFile, settings: LoRASettings, workflow: str) -> LoadedAdapter:
        partition = repo.partition_for(workflow)
        if self.policy.hosted and self.policy.max_cache_bytes is not None and file.repo_id is not None:
            trim_hub_cache(self.policy.max_cache_bytes, keep_commits={file.commit},
                           protected_repos=self.policy.protected_repos)
        config = _config_version(file)
        key = AdapterKey(source=f"{settings.source}#{partition}#{settings.qkv_layout}#{config}"
                                f"#{settings.skip_parts}#{settings.any_partition}",
                         revision=file.commit or settings.revision, file=file.filename, size=file.size,
                         sha256=file.sha256())

        # The same registry rule as Inspect (for a local file too: a demo adapter is a known one).
        repo_id, filename = registry_identity(str(file.path), settings.weight_name, file.filename,
                                              repo_id=file.repo_id)

        def read() -> NormalisedAdapter:
            return load_adapter(file.path, shapes=self.shapes(workflow), qkv_layout=settings.qkv_layout,
                                partition=partition, repo_id=repo_id, filename=filename,
                                adapter_config_path=file.adapter_config_path, skip_parts=settings.skip_parts,
                                any_partition=settings.any_partition)

        adapter = self.cache.get_or_load(key, read)
        return LoadedAdapter(settings=settings, file=file, adapter=adapter, config_version=config)

    def _unchanged(self, loaded: LoadedAdapter, token: str | None) -> bool:
        """Does ``loaded``'s source still name the bytes that are attached? Local: ``stat`` of the file and of its
        ``adapter_config.json``; Hub: the commit the revision points at now (one HEAD; none for a commit sha)."""
        identity = sources.current_identity(loaded.file, self.policy.token(token))
        return identity == loaded.file.identity and _config_version(loaded.file) == loaded.config_version

    def _check_access(self, file: sources.AdapterFile, token: str | None) -> None:
        """Hosted mode: this job's token must open the file, even when the cache (or the engine) already holds it;
        offline, an earlier online check must have shown it may (``access_ledger.py``)."""
        if not self.policy.hosted or file.repo_id is None:
            return
        from huggingface_hub import constants

        sent = self.policy.token(token)
        if constants.HF_HUB_OFFLINE:
            self.access.check_offline(file.repo_id, file.filename, file.commit, sent)
            return
        sources.check_access(file.repo_id, file.filename, file.revision, sent)
        self.access.record(file.repo_id, file.filename, file.commit, sent)

    def dry_run(self, loaded: LoadedAdapter, workflow: str = T2VA) -> MatchReport:
        """The match report against the held transformer, without binding anything."""
        return self.engine(workflow).match(loaded.adapter, loaded.settings, name=adapter_slot_name(loaded.settings))

    def apply(self, adapters: Sequence[LoRASettings], workflow: str = T2VA, token: str | None = None,
              progress: Callable[[int, int | None], None] | None = None) -> list[LoadedAdapter]:
        """Make ``workflow``'s transformer carry exactly ``adapters`` (in any order; each with its own alpha,
        strength, group strengths). Returns their provenance. On any error every adapter is detached (bitwise
        base) and the error is re-raised.

        Every job asks whether each attached adapter's source still names the same bytes
        (``sources.current_identity``: a ``stat`` for local files, one HEAD for a Hub branch): one whose branch moved
        on, or whose local file or ``adapter_config.json`` was rewritten, is replaced by the new version.
        ``progress(done_bytes, total_bytes)`` follows each download."""
        if not adapters:
            self.baseline(workflow)  # compiled: at strength 0 in place (module classes unchanged), else detached
            return []
        modes = {a.mode for a in adapters}
        if len(modes) > 1:
            raise H3AppError("all adapters of one job must use the same mode (unmerged or merged): pick one.")
        if MERGED in modes and self.model.options.fp8:
            raise H3AppError(fp8.MERGED_REFUSAL)
        names = [adapter_slot_name(a) for a in adapters]
        if len(set(names)) != len(names):
            raise H3AppError("the same adapter file is listed twice: combine the two into one with the summed scale.")
        with self._lock:
            engine = self.engine(workflow)
            try:
                loaded = []
                for name, settings in zip(names, adapters):
                    attached = self._files.get(name) if name in engine.active() else None
                    if attached is not None and self._unchanged(attached, token):
                        self._check_access(attached.file, token)
                        loaded.append(attached)
                        continue
                    if attached is not None:  # a new version of the same source: the old one goes
                        engine.detach(name)
                        self._files.pop(name, None)
                    loaded.append(self.load(settings, workflow, token, progress))
                for name in list(engine.active()):
                    if name not in names:
                        engine.detach(name)
                        self._files.pop(name, None)
                if modes:
                    engine.set_mode(modes.pop())
                result = []
                for name, settings, item in zip(names, adapters, loaded):
                    if name in engine.active():
                        engine.set_lora(name, alpha=settings.alpha, strength=settings.strength,
                                        group_strengths=settings.group_strengths, advanced=settings)
                    else:
                        engine.attach(item.adapter, settings, name)
                    item = replace(item, settings=settings)
                    self._files[name] = item
                    result.append(item)
                return result
            except torch.OutOfMemoryError as error:
                self.reset(workflow)
                raise H3AppError("out of GPU memory while applying the adapters (the model is back at its base): "
                                 "use unmerged mode, fewer adapters, or --offload auto.") from error
            except BaseException:
                self.reset(workflow)
                raise

    def baseline(self, workflow: str = T2VA, adapters: Sequence[LoRASettings] = (), token: str | None = None) -> None:
        """No adapter's effect on ``workflow``'s transformer, for a no-LoRA run. With ``--compile``, unmerged
        adapters made of low-rank pairs only stay attached at strength 0 (``adapters``, the ones the next runs use,
        attached first), so the compiled blocks see the same module classes and graph inputs as the LoRA runs
        around it: no recompile (``model/compiled.py``). Otherwise (eager, merged mode, exact parts, DoRA — whose
        magnitude applies at strength 0) every adapter is detached: the weights are bitwise the base."""
        if not self.model.options.compile:
            self.reset(workflow)
            return
        if adapters and all(a.mode == UNMERGED for a in adapters):
            self.apply(adapters, workflow, token)
        with self._lock:
            engine = self.engine(workflow)
            try:
                for name, settings in engine.active().items():
                    adapter = engine.adapter(name)  # DoRA: its magnitude applies at strength 0, so off = detached
                    if engine.mode != UNMERGED or adapter.has_exact_parts or adapter.has_magnitudes:
                        engine.detach(name)
                        self._files.pop(name, None)
                    elif settings.strength != 0:
                        engine.set_lora(name, strength=0.0)
            except BaseException:
                self.reset(workflow)
                raise

    @contextmanager
    def padded(self, adapters: Sequence[LoRASettings], workflow: str = T2VA, token: str | None = None
               ) -> Iterator[int | None]:
        """Around a grid over ``adapters``: with ``--compile`` and more than one factor width among them, or rows on
        different modules, every A/B pair attached meanwhile is zero-padded to the largest width (diffusers'
        hotswap ``target_rank`` does the same) and every row gets an all-zero entry on the modules only other rows
        cover (unfused ones), so the compiled blocks see one structure and nothing recompiles; yields that width,
        else None. Adapters attached before are detached first (their factors have their own widths)."""
        ranks: set[int] = set()
        layouts: set[frozenset[str]] = set()  # each row's module paths
        engine = self.engine(workflow)
        if self.model.options.compile and len(adapters) > 1:
            for settings in adapters:
                adapter = self.load(settings, workflow, token).adapter
                ranks.update(m.width for m in adapter.modules.values())
                layouts.add(frozenset(engine.module_paths(adapter.modules)))
        if len(ranks) < 2 and len(layouts) < 2:
            yield None
            return
        self.reset(workflow)
        engine.factor_rank = max(ranks)
        engine.factor_paths = frozenset().union(*layouts) if len(layouts) > 1 else frozenset()
        try:
            yield engine.factor_rank
        finally:
            engine.factor_rank, engine.factor_paths = None, frozenset()

    def reset(self, workflow: str | None = None) -> None:
        """Detach every adapter (of one partition, or all): the transformers are bitwise their base."""
        with self._lock:
            partitions = [repo.partition_for(workflow)] if workflow else list(self._engines)
            for partition in partitions:
                engine = self._engines.get(partition)
                if engine is not None and engine.active():
                    engine.detach()
            self._files = {n: f for n, f in self._files.items()
                           if any(n in e.active() for e in self._engines.values())}

    def report(self, settings: LoRASettings, workflow: str = T2VA) -> MatchReport:
        """The match report (with strength profile) of an attached adapter at its current settings."""
        return self.engine(workflow).report(adapter_slot_name(settings))

