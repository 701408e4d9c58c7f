// The comparison view (gr.HTML js_on_load body: `element`, `props`, `watch` come from Gradio).
// props.value (h3app/ui/compare/view.py): {fps, columns: [{key, label, caption, mark, video, thumb, audio}],
// show: [column indexes played side by side], grids: [{title, corner, headers, baseline, rows: [{header, cells}]}],
// empty}. Files are Gradio FileData ({url}); every text is set with textContent (labels come from adapter files).
// One transport for all players: the first shown video leads; the others are re-seeked whenever they drift by
// more than half a frame, so they stay within one frame of it.
(function () {
  const state = {picked: null, run: null, mode: "side", sound: "", wipe: 50, blinkTimer: null, playing: false};

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  function url(file) {
    if (!file) return "";
    const link = file.url || "";
    const root = (window.gradio_config && window.gradio_config.root) || "";
    return link.startsWith("/") && root ? root.replace(/\/$/, "") + link : link;
  }

  const value = () => props.value || {};
  const fps = () => Number(value().fps) || 24;
  const videos = () => Array.from(element.querySelectorAll("video.h3cv-video"));
  const leader = () => videos()[0];

  function fmt(t) {
    return (Number.isFinite(t) ? t : 0).toFixed(2);
  }

  function showTime() {
    const lead = leader();
    const time = element.querySelector(".h3cv-time");
    const scrub = element.querySelector(".h3cv-scrub");
    if (!lead || !time) return;
    const duration = Number.isFinite(lead.duration) ? lead.duration : 0;
    const frames = Math.max(1, Math.round(duration * fps()));
    const frame = Math.min(frames, Math.floor(lead.currentTime * fps() + 1e-6) + 1);
    time.textContent = `${fmt(lead.currentTime)} s / ${fmt(duration)} s · frame ${frame} / ${frames}`;
    if (scrub && document.activeElement !== scrub) {
      scrub.max = String(duration || 1);
      scrub.value = String(lead.currentTime);
    }
  }

  function seekAll(t) {
    for (const video of videos()) {
      if (Math.abs(video.currentTime - t) > 1e-3) video.currentTime = t;
    }
    showTime();
  }

  function setButton() {
    const button = element.querySelector(".h3cv-play");
    if (button) button.textContent = state.playing ? "❚❚ Pause all" : "▶ Play all";
  }

  function tick() {
    if (!state.playing) return;
    const lead = leader();
    if (!lead) return;
    const t = lead.currentTime;
    const tolerance = 0.5 / fps();
    for (const video of videos()) {
      if (video === lead) continue;
      if (!video.seeking && Math.abs(video.currentTime - t) > tolerance) video.currentTime = t;
      if (video.paused && !video.ended && !lead.paused) video.play().catch(() => {});
    }
    showTime();
    requestAnimationFrame(tick);
  }

  function play() {
    const lead = leader();
    if (!lead) return;
    if (lead.ended) seekAll(0);
    seekAll(lead.currentTime);
    state.playing = true;
    setButton();
    Promise.all(videos().map((video) => video.play().catch(() => {}))).then(() => requestAnimationFrame(tick));
  }

  function pause() {
    state.playing = false;
    for (const video of videos()) video.pause();
    const lead = leader();
    if (lead) seekAll(lead.currentTime);
    setButton();
  }

  function step(frames) {
    const lead = leader();
    if (!lead) return;
    pause();
    const rate = fps();
    const last = Math.max(0, Math.round((lead.duration || 0) * rate) - 1);
    const frame = Math.min(last, Math.max(0, Math.floor(lead.currentTime * rate + 1e-6) + frames));
    seekAll((frame + 0.5) / rate);  // the middle of the frame: no decoder lands on its neighbour
  }

  function onEnded(event) {
    if (event.target !== leader()) return;
    const loop = element.querySelector(".h3cv-loop input");
    if (loop && loop.checked && state.playing) {
      seekAll(0);
      play();
    } else {
      state.playing = false;
      setButton();
    }
  }

  function applySound() {
    for (const video of videos()) video.muted = video.dataset.key !== state.sound;
  }

  function pairIndexes(shown) {
    const a = element.querySelector(".h3cv-pair-a");
    const b = element.querySelector(".h3cv-pair-b");
    const first = a ? Number(a.value) : shown[0];
    const second = b ? Number(b.value) : shown[1];
    return [first, second];
  }

  function applyMode() {
    const stage = element.querySelector(".h3cv-players");
    if (!stage) return;
    const shown = (stage.dataset.shown || "").split(",").filter((x) => x !== "").map(Number);
    const [under, over] = pairIndexes(shown);
    stage.classList.remove("h3cv-side", "h3cv-wipe", "h3cv-blink");
    stage.classList.add(`h3cv-${state.mode}`);
    for (const figure of stage.querySelectorAll("figure")) {
      const index = Number(figure.dataset.index);
      figure.classList.toggle("h3cv-under", state.mode !== "side" && index === under);
      figure.classList.toggle("h3cv-over", state.mode !== "side" && index === over);
      figure.classList.toggle("h3cv-off", state.mode !== "side" && index !== under && index !== over);
      figure.style.clipPath = "";
    }
    for (const frame of stage.querySelectorAll(".h3cv-frame")) frame.style.clipPath = "";
    const overFigure = stage.querySelector("figure.h3cv-over .h3cv-frame");
    if (overFigure && state.mode === "wipe") {
      overFigure.style.clipPath = `inset(0 0 0 ${state.wipe}%)`;
      overFigure.querySelector(".h3cv-line").style.left = `${state.wipe}%`;
    }
    const wipeBar = element.querySelector(".h3cv-wipebar");
    if (wipeBar) wipeBar.hidden = state.mode === "side";
    const wipe = element.querySelector(".h3cv-wipe-at");
    if (wipe) wipe.hidden = state.mode !== "wipe";
    if (state.blinkTimer) clearInterval(state.blinkTimer);
    state.blinkTimer = null;
    const shownLabel = element.querySelector(".h3cv-showing");
    const columns = value().columns || [];
    const label = (index) => (columns[index] ? columns[index].key : "?");
    if (shownLabel) shownLabel.textContent = state.mode === "wipe" ?
      `left of the line: ${label(under)} · right: ${label(over)}` : "";
    if (state.mode === "blink" && overFigure) {
      let on = true;
      const flip = () => {
        overFigure.style.visibility = on ? "visible" : "hidden";
        if (shownLabel) shownLabel.textContent = `showing ${label(on ? over : under)}`;
        on = !on;
      };
      flip();
      state.blinkTimer = setInterval(() => {
        if (!element.isConnected) clearInterval(state.blinkTimer);
        else flip();
      }, 600);
    } else if (overFigure) {
      overFigure.style.visibility = "visible";
    }
  }

  function controls(shown, columns) {
    const options = (selected) => shown.map((index) => h("option", {value: index, selected: index === selected,
                                                                    text: columns[index].key}));
    const sound = h("select", {class: "h3cv-sound", "aria-label": "listen to",
                               onchange: (e) => { state.sound = e.target.value; applySound(); }},
                    h("option", {value: "", text: "muted"}),
                    ...shown.map((index) => h("option", {value: columns[index].key, text: columns[index].key,
                                                         selected: columns[index].key === state.sound})));
    const mode = h("select", {class: "h3cv-mode", "aria-label": "view",
                              onchange: (e) => { state.mode = e.target.value; applyMode(); }},
                   ...[["side", "side by side"], ["wipe", "A|B wipe"], ["blink", "blink"]].map(
                     ([key, text]) => h("option", {value: key, text, selected: key === state.mode})));
    if (shown.length < 2) mode.disabled = true;
    const loop = h("input", {type: "checkbox", checked: true, "aria-label": "loop"});
    loop.checked = true;
    const bar = h("div", {class: "h3cv-bar"},
      h("button", {class: "h3cv-play h3cv-button h3cv-primary", type: "button",
                   onclick: () => (state.playing ? pause() : play()), text: "▶ Play all"}),
      h("button", {class: "h3cv-button", type: "button", title: "previous frame", "aria-label": "previous frame",
                   onclick: () => step(-1), text: "◀ frame"}),
      h("button", {class: "h3cv-button", type: "button", title: "next frame", "aria-label": "next frame",
                   onclick: () => step(1), text: "frame ▶"}),
      h("label", {class: "h3cv-loop"}, loop, h("span", {text: " loop"})),
      h("input", {class: "h3cv-scrub", type: "range", min: 0, max: 1, step: "any", value: 0,
                  "aria-label": "position",
                  oninput: (e) => { if (state.playing) pause(); seekAll(Number(e.target.value)); }}),
      h("span", {class: "h3cv-time", text: "0.00 s"}),
      h("label", {class: "h3cv-field"}, h("span", {text: "view "}), mode),
      h("label", {class: "h3cv-field"}, h("span", {text: "sound "}), sound));
    const pair = h("div", {class: "h3cv-wipebar", hidden: true},
      h("label", {class: "h3cv-field"}, h("span", {text: "compare "}),
        h("select", {class: "h3cv-pair-a", onchange: applyMode}, ...options(shown[0]))),
      h("label", {class: "h3cv-field"}, h("span", {text: " with "}),
        h("select", {class: "h3cv-pair-b", onchange: applyMode}, ...options(shown[1]))),
      h("input", {class: "h3cv-wipe-at", type: "range", min: 0, max: 100, step: 1, value: state.wipe,
                  "aria-label": "wipe position",
                  oninput: (e) => { state.wipe = Number(e.target.value); applyMode(); }}),
      h("span", {class: "h3cv-showing"}));
    return [bar, pair];
  }

  function player(column, index) {
    const video = h("video", {class: "h3cv-video", src: url(column.video), preload: "auto", playsinline: true,
                              muted: true, "data-key": column.key, "aria-label": column.label});
    video.muted = column.key !== state.sound;
    video.addEventListener("ended", onEnded);
    video.addEventListener("loadedmetadata", showTime);
    const audio = column.audio || column.video;
    return h("figure", {class: "h3cv-column", "data-index": index, "data-key": column.key},
      h("figcaption", {class: "h3cv-label"}, h("b", {text: column.label}),
        column.mark ? h("span", {class: "h3cv-mark", text: ` ${column.mark}`}) : null),
      h("div", {class: "h3cv-frame"}, video, h("div", {class: "h3cv-line"})),
      column.caption ? h("div", {class: "h3cv-caption", text: column.caption}) : null,
      audio ? h("div", {class: "h3cv-audio"}, h("span", {text: `${column.key} sound `}),
        h("audio", {controls: true, preload: "metadata", src: url(audio), "aria-label": `${column.key} soundtrack`}))
        : null);
  }

  function shownColumns() {
    const v = value();
    const columns = v.columns || [];
    const shown = (state.picked && state.run === v.run ? state.picked : (v.show || [])).filter(
      (index) => index >= 0 && index < columns.length);
    return [shown, columns];
  }

  function renderPlayers() {
    const old = element.querySelector(".h3cv-viewer");
    for (const video of videos()) video.pause();
    state.playing = false;
    const [shown, columns] = shownColumns();
    const viewer = h("div", {class: "h3cv-viewer"});
    if (!shown.length) {
      viewer.append(h("div", {class: "h3cv-empty", text: value().empty || "Nothing to compare yet."}));
    } else {
      if (!shown.some((index) => columns[index].key === state.sound)) state.sound = "";
      viewer.append(...controls(shown, columns));
      const stage = h("div", {class: "h3cv-players h3cv-side", "data-shown": shown.join(","),
                              style: `--h3cv-count: ${Math.min(shown.length, 3)}`});
      shown.forEach((index) => stage.append(player(columns[index], index)));
      viewer.append(stage);
    }
    if (old) old.replaceWith(viewer); else element.append(viewer);
    applyMode();
    markPicked();
  }

  function baselineOf(index) {
    // the no-LoRA cell of the grid (seed) that holds column ``index``; ``index`` itself when it has none
    for (const grid of value().grids || []) {
      const cells = (grid.rows || []).flatMap((row) => row.cells || []);
      if ((cells.includes(index) || grid.baseline === index) && grid.baseline !== null &&
          grid.baseline !== undefined) return grid.baseline;
    }
    return index;
  }

  function pick(index) {
    // The first click of a run plays the cell beside its no-LoRA baseline; each further click beside the cell
    // clicked before it (A and B), so any two cells can be put side by side.
    const v = value();
    const picked = state.picked && state.run === v.run ? state.picked : null;
    const previous = picked ? picked[picked.length - 1] : baselineOf(index);
    state.run = v.run;
    state.picked = previous === index ? [index] : [previous, index];
    renderPlayers();
    const viewer = element.querySelector(".h3cv-viewer");
    if (viewer && viewer.scrollIntoView) viewer.scrollIntoView({block: "nearest"});
  }

  function markPicked() {
    const [shown, columns] = shownColumns();
    for (const cell of element.querySelectorAll(".h3cv-cell")) {
      const at = shown.indexOf(Number(cell.dataset.index));
      cell.classList.toggle("h3cv-picked", at >= 0);
      const badge = cell.querySelector(".h3cv-badge");
      if (badge) badge.textContent = at >= 0 ? (at === 0 ? "A" : "B") : "";
    }
    return columns;
  }

  function cell(columns, index) {
    const column = columns[index];
    if (!column) return h("td", {class: "h3cv-pending", text: "…"});
    return h("td", {},
      h("button", {class: "h3cv-cell", type: "button", "data-index": index, title: `compare ${column.label}`,
                   onclick: () => pick(index)},
        h("span", {class: "h3cv-badge"}),
        column.thumb ? h("img", {src: url(column.thumb), alt: column.label}) : null,
        h("span", {class: "h3cv-cell-label", text: column.label}),
        column.caption ? h("span", {class: "h3cv-cell-caption", text: column.caption}) : null,
        column.mark ? h("span", {class: "h3cv-mark", text: column.mark}) : null));
  }

  function renderGrids(columns) {
    const holder = h("div", {class: "h3cv-grids"});
    for (const grid of value().grids || []) {
      const head = h("tr", {}, h("th", {scope: "col", class: "h3cv-corner", text: grid.corner || ""}),
                     ...(grid.headers || []).map((text) => h("th", {scope: "col", text})));
      const body = h("tbody", {});
      if (grid.baseline !== null && grid.baseline !== undefined) {
        body.append(h("tr", {class: "h3cv-baseline-row"}, h("th", {scope: "row", text: "no LoRA"}),
                      cell(columns, grid.baseline)));
      }
      for (const row of grid.rows || []) {
        body.append(h("tr", {}, h("th", {scope: "row", text: row.header}),
                      ...row.cells.map((index) => cell(columns, index))));
      }
      holder.append(h("div", {class: "h3cv-grid"}, h("div", {class: "h3cv-grid-title", text: grid.title || ""}),
                      h("div", {class: "h3cv-grid-scroll"},
                        h("table", {class: "h3cv-cells"}, h("thead", {}, head), body))));
    }
    return holder;
  }

  function render() {
    for (const video of videos()) video.pause();
    if (state.blinkTimer) clearInterval(state.blinkTimer);
    state.blinkTimer = null;
    element.replaceChildren();
    const v = value();
    const root = h("div", {class: "h3cv"});
    element.append(root);
    if (v.title) root.append(h("div", {class: "h3cv-title", text: v.title}));
    if ((v.grids || []).length) root.append(renderGrids(v.columns || []));
    root.append(h("div", {class: "h3cv-viewer"}));  // filled (and refilled on every pick) by renderPlayers
    renderPlayers();
  }

  render();
  watch("value", render);
})();
