"""Adapter panel events: list a source's weight files, take an upload, Inspect (header only), the live readout,
Load (fetch + bind + match report) and the strength profile. Each method takes plain values and returns what the
panel shows; backend errors become ``gr.Error`` with the backend's one-line message.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd
from gradio.utils import get_upload_folder

from ...adapters.source import implied_weight
from ...errors import H3AppError
from ...hosting.upload_policy import UploadPolicy
from ...hosting.upload_quota import discard, upload_quota
from ...hosting.visitors import session_key, visitor_keys
from ...lora.profile_rescale import profile_basis, profile_view
from ...rules.choices import T2VA
from ...rules.strength import FAR_ABOVE_FACTOR
from ...rules.units import format_bytes
from ...settings import LoRASettings
from ..forms import KEEP, SlotForm, SyncForm, chain_text
from ..gradio_compat import client_gone
from ..presenters import render
from ..presenters.visitor_words import visitor_text
from ..session import RunningJobs, Session, new_session, with_adapter
from ..user_error import user_error

if TYPE_CHECKING:
    from ...backend.service import Backend

UPLOAD_LABEL = "upload: "  # the source box shows an upload as this and its file name, never its server folder
TOY_WEIGHTS_MODEL = "tiny"  # the embedded demo checkpoint: a toy, so sizes relative to its weights say nothing of H3

NO_SCALE = "no effective scale: the alpha card above says which value is refused"
# An inspect info key: the override a switch of adapters dropped ({"alpha", "name"}), shown on the alpha card.
DROPPED_OVERRIDE = "override_dropped"


def shown_path(path: str) -> str:
    """``path`` relative to the app's working folder when inside it (hosted answers name no server folder)."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def adapter_identity(source: str, weight_name: str | None, revision: str | None) -> list[str]:
    """Which file an info describes (source, weight, revision): an override belongs to one of them."""
    return [str(source).strip(), weight_name or "", (revision or "").strip()]


def demo_question(given: str, demo: str) -> str:
    """The confirm row's question when a demo pick would replace a source the person gave."""
    return render.card("info", f"The source box holds <b>{render.esc(given[:120])}</b>. Replace it with the demo "
                               f"adapter <b>{render.esc(demo)}</b>?", testid="demo-question")


@dataclass(frozen=True)
class Readout:
    """The alpha card and the effective-scale readout."""

    alpha_html: str
    readout: str


@dataclass(frozen=True)
class ProfileBars:
    """The strength profile: by-group bars, by-block bars (``gr.update``s) and the note under them."""

    group_plot: Any
    block_plot: Any
    profile_html: Any


@dataclass(frozen=True)
class SourcePick:
    """A file put in the slot (a demo pick, an upload): the source box and the weight dropdown (KEEP: unchanged).
    A demo pick over a source the person gave waits for their word: ``pending`` holds the demo's path, the confirm
    row (``confirm_box``, ``confirm_note``) asks, and the source box keeps what they gave."""

    source: Any = KEEP
    weight: Any = KEEP
    pending: Any = KEEP
    confirm_box: Any = KEEP
    confirm_note: Any = KEEP
    demo: Any = KEEP


@dataclass(frozen=True)
class UploadView:
    """What an upload shows in its slot: the file's name as the source, its weight file picked, and the server
    path behind the name in session state (``SlotForm.uploaded``)."""

    source: str
    weight: dict[str, Any]
    uploaded: dict[str, str]


@dataclass(frozen=True)
class InspectView:
    """What Inspect shows in the slot (``alpha``: the alpha box, KEEP while Override is ticked)."""

    info: dict[str, Any] | None
    inspect_html: str
    alpha_html: str = ""
    readout: str = ""
    known_html: str = ""
    known_box: Any = KEEP
    targets: Any = KEEP
    info_json: Any = KEEP
    alpha: Any = KEEP
    override: Any = KEEP


@dataclass(frozen=True)
class LoadView:
    """What Load shows: the session with the slot set, the match report and the strength profile."""

    session: Session
    info: dict[str, Any]
    report_html: str
    basis: dict[str, Any] | None
    group_plot: Any
    block_plot: Any
    profile_html: Any
    profile_box: Any


class AdapterEvents:
    """Event functions of the adapter panel, bound to one backend."""

    def __init__(self, backend: Backend, jobs: RunningJobs | None = None) -> None:
        self.backend = backend
        self.jobs = jobs or RunningJobs()
        self.upload_policy = UploadPolicy.of(backend.policy, backend.uploads_dir)
        limit = self.upload_policy.max_bytes
        self.uploads = upload_quota(backend.uploads_dir, limit) if limit else None

    # ---------------------------------------------------------------------------------------------- choosing
    def demo_choices(self) -> list[tuple[str, str]]:
        """(label, path) for each demo adapter shipped with the app."""
        return [(Path(p).name, shown_path(p) if self.backend.hosted else p) for p in self.backend.demo_adapters()]

    def list_weights(self, source: str | None, revision: str | None = None, token: str | None = None,
                     current: str | None = None) -> dict[str, Any]:
        """The weight-file dropdown for ``source`` (name + size); keeps ``current`` when it is still listed."""
        if not source or not str(source).strip():
            return gr.update(choices=[], value=None)
        try:
            files = self.backend.list_weights(str(source).strip(), (revision or "").strip() or None, token or None)
        except H3AppError as error:
            raise user_error(error) from error
        choices = [(f"{f.name} — {format_bytes(f.size)}", f.name) for f in files]
        names = [f.name for f in files]
        value = current if current in names else (names[0] if len(names) == 1 else None)
        return gr.update(choices=choices, value=value)

    def pick_demo(self, path: str | None, revision: str | None = None, token: str | None = None,
                  current: str | None = None) -> SourcePick:
        """A demo adapter chosen: put its path in the source box and list its weight file(s) — when the box is
        empty or holds a demo adapter already. A source the person gave (``current``: typed, pasted or uploaded)
        is never overwritten: the pick waits in ``pending`` and the confirm row asks first."""
        if not path:
            return SourcePick()
        given = str(current or "").strip()
        if given and given != path and given not in {value for _, value in self.demo_choices()}:
            return SourcePick(pending=path, confirm_box=gr.update(visible=True),
                              confirm_note=demo_question(given, Path(path).name))
        return self.confirm_demo(path, revision, token)

    def confirm_demo(self, path: str | None, revision: str | None = None, token: str | None = None) -> SourcePick:
        """The demo pick confirmed (or nothing was lost by it): its path in the source box, its weight file(s)."""
        if not path:
            return SourcePick(pending=None, confirm_box=gr.update(visible=False))
        return SourcePick(path, self.list_weights(path, revision, token), pending=None,
                          confirm_box=gr.update(visible=False))

    @staticmethod
    def keep_source() -> SourcePick:
        """The demo pick declined: the person's source stays, the demo dropdown lets go of the pick."""
        return SourcePick(pending=None, confirm_box=gr.update(visible=False), demo=None)

    def upload(self, file_path: str | None, request: gr.Request | None = None) -> SourcePick:
        """Move an uploaded ``.safetensors`` where the backend's upload policy puts it (an allowed adapter folder,
        cleaned after an hour) and select it. The policy refuses it in one line; hosted mode also counts the
        visitor's and the folder's upload bytes (``hosting/upload_quota.py``)."""
        if not file_path:
            return SourcePick()
        upload = Path(file_path)
        try:
            size, visitor = self._admit_upload(upload, request)
        except gr.Error:
            discard(upload)  # a refused upload leaves nothing behind
            raise
        target = self.upload_policy.destination(upload.name)
        if Path(get_upload_folder()).resolve() in upload.resolve().parents:
            shutil.move(upload, target)  # Gradio's cached copy becomes the app's: one copy on disk, not two
        else:
            shutil.copyfile(upload, target)
        if self.uploads is not None:
            self.uploads.record(visitor, target)
        return SourcePick(str(target), gr.update(choices=[(f"{target.name} — {format_bytes(size)}", target.name)],
                                                 value=target.name))

    def _admit_upload(self, upload: Path, request: gr.Request | None) -> tuple[int, str]:
        """(size, visitor) of an upload the server takes; else one ``gr.Error`` line (suffix, size, quota)."""
        visitor = " ".join(visitor_keys(request))
        try:
            self.upload_policy.check_name(upload.name)
            size = upload.stat().st_size
            self.upload_policy.check_size(upload.name, size)
            if self.uploads is not None:
                self.uploads.reserve(visitor, size)
        except H3AppError as error:
            raise user_error(error) from error
        return size, visitor

    def upload_view(self, file_path: str | None, request: gr.Request | None = None) -> UploadView | None:
        """:meth:`upload`, shown without the uploads folder: ``upload: name.safetensors`` in the source box (None:
        nothing was uploaded)."""
        if not file_path:
            return None
        stored = self.upload(file_path, request)
        shown = f"{UPLOAD_LABEL}{Path(stored.source).name}"
        return UploadView(source=shown, weight=stored.weight, uploaded={"shown": shown, "path": stored.source})

    # ---------------------------------------------------------------------------------------------- inspect
    def inspect(self, source: str | None, weight_name: str | None, revision: str | None, token: str | None,
                workflow: str = T2VA, qkv_layout: str = "auto") -> dict[str, Any]:
        """``AdapterInfo.to_json()`` from the header only (remote: HTTP ranges); nothing is downloaded."""
        if not source or not str(source).strip():
            raise gr.Error("the adapter source is empty: paste a Hub repo id, an HF URL or a local path, or pick a "
                           "demo adapter.", print_exception=False)
        source = str(source).strip()
        try:
            hosted_dirs = list(self.backend.policy.allowed_local_dirs) if self.backend.hosted else None
            name = implied_weight(source, weight_name, allowed_local_dirs=hosted_dirs)  # never looks outside them
            info = self.backend.inspect(source, name, (revision or "").strip() or None, token or None,
                                        workflow=workflow or T2VA, qkv_layout=qkv_layout or "auto")
        except H3AppError as error:
            raise user_error(error) from error
        data = info.to_json()
        data["name"] = weight_name or Path(str(source).strip()).name
        data["adapter"] = adapter_identity(source, weight_name, revision)
        return data

    def inspect_view(self, slot: SlotForm, token: str | None = None, workflow: str = T2VA,
                     previous: dict[str, Any] | None = None) -> InspectView:
        """Inspect and render. With Override off, the alpha box shows the chain's value as a starting point. An
        override set for another adapter (``previous``: the info the slot showed) is dropped, and the alpha card
        says so: an alpha belongs to the file it was chosen for. The same file inspected again (Enter, a repeated
        event) leaves Override and the alpha box as they are: its values were read before, and what the person
        typed since must not be overwritten with them."""
        info = self.inspect(slot.source_to_read, slot.weight, slot.revision, token, workflow, slot.qkv_layout)
        chain = chain_text(info)
        before = previous or {}
        same = bool(previous) and before.get("adapter") == info["adapter"]
        overrides = replace(slot, info=previous).overrides  # an alpha typed for the file shown before, or now
        switched = bool(overrides and previous and not same)
        if switched or (same and DROPPED_OVERRIDE in before):
            # the note rides with this inspect's info, so every later redraw of the alpha card keeps it
            dropped = before.get(DROPPED_OVERRIDE) or {"alpha": str(slot.alpha),
                                                       "name": before.get("name", "the previous adapter")}
            info = {**info, DROPPED_OVERRIDE: dropped}
        slot = replace(slot, override=overrides and not switched, info=info,
                       alpha=slot.alpha if overrides and not switched else chain)
        alpha_box = KEEP if same or slot.override else chain
        tick = KEEP if same else slot.override
        shown = self.readout(info, slot)
        alpha_html = shown.alpha_html
        return InspectView(info=info, inspect_html=render.inspect_card(info, info.get("name", "")),
                           alpha_html=alpha_html, readout=shown.readout, override=tick,
                           known_html=render.known_card(info.get("known")),
                           known_box=gr.update(visible=bool(info.get("known"))),
                           targets=pd.DataFrame(render.targets_table(info), columns=render.TARGET_COLUMNS),
                           info_json=info, alpha=alpha_box)

    def readout(self, info: dict[str, Any] | None, slot: SlotForm) -> Readout:
        """Alpha card and effective-scale readout — pure math, run on every slider move."""
        try:
            used = slot.alpha_value()
            strength = slot.strength_value()
        except H3AppError as error:  # the alpha card says why, once; the readout only says there is no scale
            return Readout(render.refused_card(visitor_text(str(error))),
                           render.readout_html(info, None, 1.0, problem=NO_SCALE))
        if not info:
            return Readout("", render.readout_html(None, used, strength))
        card = render.alpha_card(info, used)
        dropped = info.get(DROPPED_OVERRIDE)
        if dropped and not slot.overrides:
            card = render.card("info", f"Override alpha {render.esc(dropped['alpha'])} was for "
                                       f"{render.esc(dropped['name'])}: dropped, this adapter runs its own alpha.",
                               testid="override-dropped") + card
        return Readout(card, render.readout_html(info, used, strength))

    # ------------------------------------------------------------------------------------------------- load
    def load(self, session: Session | None, slot: str, settings: LoRASettings, workflow: str = T2VA,
             token: str | None = None, request: gr.Request | None = None, progress: Any = None
             ) -> tuple[Session, Any]:
        """Fetch only the pinned file, normalise and bind it as a worker job; the session's ``slot`` now holds
        ``settings``. Returns (session, LoadResult). Zero matches raise; a partial match warns."""
        handle = self.backend.submit_load(settings, workflow or T2VA, token or None)

        def on_step(done: int, total: int) -> None:
            if progress is not None:  # a fraction: the sizes are written once, in our units (Gradio's own are not)
                progress(done / total if total else None,
                         desc=f"downloading {format_bytes(done)} of {format_bytes(total)}")

        def on_phase(phase: str) -> None:
            if progress is not None:
                progress(None, desc=phase)

        try:
            with self.jobs.track(session_key(request), handle):
                result = self.backend.run(handle, on_step, on_phase, client_gone())
        except H3AppError as error:
            raise user_error(error) from error
        if result.report.unmatched_keys:
            gr.Warning(f"partial match: {len(result.report.unmatched_keys)} adapter keys matched nothing in this "
                       f"model and are ignored (see the match report).")
        return with_adapter(session, slot, settings), result

    def load_view(self, session: Session | None, slot_name: str, slot: SlotForm, mode: str,
                  workflow: str = T2VA, token: str | None = None, request: gr.Request | None = None,
                  progress: Any = None) -> LoadView:
        """Load and render: the session with ``slot_name`` set, the match report and the strength profile."""
        try:
            settings = slot.settings(mode)
        except H3AppError as error:
            raise user_error(error) from error
        if settings is None:
            raise gr.Error("the adapter source is empty: paste a Hub repo id, an HF URL or a local path, or pick a "
                           "demo adapter.", print_exception=False)
        session, result = self.load(session, slot_name, settings, workflow, token, request, progress)
        info = result.info.to_json()
        info["name"] = result.provenance.get("weight_name") or Path(settings.source).name
        basis = profile_basis(result.report, info, settings.group_strengths)
        if basis is not None:
            basis["toy_weights"] = self.backend.model_name == TOY_WEIGHTS_MODEL
        bars = self.profile(basis, slot)
        return LoadView(session=session, info=info,
                        report_html=render.report_card(result.report.to_json(), result.provenance), basis=basis,
                        group_plot=bars.group_plot, block_plot=bars.block_plot, profile_html=bars.profile_html,
                        profile_box=gr.update(visible=basis is not None))

    def profile(self, basis: dict[str, Any] | None, slot: SlotForm) -> ProfileBars:
        """By-group and by-block bars of the loaded adapter at the slot's alpha/strength (``gr.update``s carrying a
        DataFrame and a y axis from 0 to just above the tallest bar), and the note."""
        if not basis:
            return ProfileBars(gr.update(value=pd.DataFrame({"group": [], "relative update": []})),
                               gr.update(value=pd.DataFrame({"block": [], "relative update": []})),
                               render.placeholder("Load the adapter to measure where it acts and how hard."))
        try:
            used = slot.alpha_value()
            strength = slot.strength_value()
            blocks = slot.advanced.settings().blocks
        except H3AppError:
            return ProfileBars(KEEP, KEEP, KEEP)
        view = profile_view(basis, used, strength, blocks)
        low, high = basis["usual_range"]
        if basis.get("toy_weights"):  # the heuristic is shown, ranked below the file's facts and disarmed
            text = (f"<b>Size heuristic — meaningless on this model:</b> its weights are the embedded tiny "
                    f"checkpoint's, not a real H3's, so sizes relative to them say nothing about the adapter; follow the alpha card "
                    f"above. At alpha {'auto' if used is None else f'{used:g}'} × scale {strength:g} the median "
                    f"relative update ‖ΔW‖/‖W‖ is {view.median:.3g}"
                    + (f" (it would say: {render.esc(view.warning)})" if view.warning else "") + ".")
            return ProfileBars(*self._bars(view), render.card("plain", text, testid="profile-note"))
        far_above = view.median > FAR_ABOVE_FACTOR * high
        position = (f"{view.median / high:.3g}× the top of" if view.median > high else
                    "below" if view.median < low else "inside")
        text = (f"median relative update ‖ΔW‖/‖W‖ <b>{view.median:.3g}</b> — {position} the usual "
                f"{low:g}–{high:g} of a well-scaled LoRA fine-tune (a heuristic).")
        kind = "bad" if view.warning else "warn" if far_above else "plain"
        note = render.card(kind, (f"<b>⚠ {render.esc(view.warning)}</b><br>" if view.warning else "") + text,
                           testid="profile-note")
        return ProfileBars(*self._bars(view), note)

    @staticmethod
    def _bars(view: Any) -> tuple[Any, Any]:
        """By-group and by-block bar updates, both on one y axis from 0 to just above the tallest bar."""
        by_group, by_block = pd.DataFrame(view.by_group), pd.DataFrame(view.by_block)
        top = max([*by_group["relative update"], *by_block["relative update"], 0.0]) * 1.15 or 1.0
        return gr.update(value=by_group, y_lim=[0, top]), gr.update(value=by_block, y_lim=[0, top])

    # --------------------------------------------------------------------------------------------- sessions
    def set_lora(self, session: Session | None, slot: str, settings: LoRASettings | None) -> Session:
        """Edit the session's ``slot`` for its next job (None clears it); nothing runs."""
        return with_adapter(session, slot, settings)

    def sync_session(self, form: SyncForm) -> Session:
        """The UI's controls → the session's adapters, right before a job (so a job always carries what the panel
        shows)."""
        updated = form.session or new_session()
        for slot_name, slot in sorted(form.slots.items()):
            try:
                settings = slot.settings(form.mode)
            except H3AppError as error:
                raise gr.Error(f"adapter {slot_name}: {visitor_text(str(error))}", title="Not run",
                               print_exception=False) from error
            updated = with_adapter(updated, slot_name, settings)
        return updated


__all__ = ["AdapterEvents", "InspectView", "demo_question", "LoadView", "ProfileBars", "Readout", "SourcePick", "UploadView"]
