// normserve playground: builds /normalize and /encode requests, shows the answers as tables and SVG plots.
// Plain browser JavaScript, no dependencies: the page must work on a machine without internet.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#6b6b6b"];
const MAX_PLOTTED_ROWS = PALETTE.length; // overlaid rows beyond this would be unreadable
const MAX_TABLE_ROWS = 64;
const MAX_TABLE_COLS = 24;

const EXAMPLES = {
  "example-seed003": { data: "[[0.2, 0.1, 0.3], [0.5, 0.1, 0.1]]", eps: "1e-5", mode: "var", k: 1 },
  "example-seed000": { data: "[[0.2, 0.8, 1.0, 1.2], [1.0, 0.0, 0.5, 1.5]]", eps: "1e-6", mode: "std", k: 1 },
  "example-seed002": { data: "[[[0.2, 0.1, 0.3]], [[0.5, 0.1, 0.1]]]", eps: "1e-5", mode: "var", k: 2 },
};

// ---------------------------------------------------------------- numbers and tensors

/** A short, exact-enough rendering: six significant digits, exponent form for tiny or huge values. */
function fmt(v) {
  if (typeof v !== "number") return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e-4 && a < 1e6) return String(parseFloat(v.toPrecision(6)));
  return v.toExponential(4);
}

/** Seeded uniform generator (mulberry32): the same seed gives the same tensor. */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal samples by Box-Muller. */
function normals(n, seed) {
  const rand = mulberry32(seed);
  const out = [];
  while (out.length < n) {
    const u = 1 - rand();
    const v = rand();
    const r = Math.sqrt(-2 * Math.log(u));
    out.push(r * Math.cos(2 * Math.PI * v), r * Math.sin(2 * Math.PI * v));
  }
  return out.slice(0, n);
}

/** The shape of a rectangular nested array (read along the first elements). */
function shapeOf(a) {
  const shape = [];
  while (Array.isArray(a)) {
    shape.push(a.length);
    a = a[0];
  }
  return shape;
}

function flatten(a) {
  return Array.isArray(a) ? a.flat(Infinity) : [a];
}

const prod = (xs) => xs.reduce((p, x) => p * x, 1);

/** Index tuple of flat row r over the leading dims, e.g. "[1, 0]". */
function rowLabel(r, lead) {
  if (lead.length === 0) return "all";
  const idx = [];
  for (let d = lead.length - 1; d >= 0; d--) {
    idx.unshift(r % lead[d]);
    r = Math.floor(r / lead[d]);
  }
  return "[" + idx.join(", ") + "]";
}

function tryParse(text) {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (e) {
    return { ok: false };
  }
}

// ---------------------------------------------------------------- requests

/** POST a JSON body; resolves to {ok, status, body, ms}, with the service's {"error": ...} kept verbatim. */
function post(path, bodyText) {
  return send(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: bodyText });
}

async function send(path, init) {
  const t0 = performance.now();
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    return { ok: false, status: 0, body: { error: "request failed: " + e.message }, ms: 0 };
  }
  const text = await res.text();
  const ms = performance.now() - t0;
  const parsed = tryParse(text);
  const body = parsed.ok ? parsed.value : { error: text || res.statusText };
  return { ok: res.ok, status: res.status, statusText: res.statusText, body, ms };
}

function showError(el, res) {
  // normserve's routes answer {"error": "..."}, the /v1/ routes OpenAI's {"error": {"message": "...", ...}}
  const err = res.body && res.body.error;
  const msg = typeof err === "string" ? err : err && typeof err.message === "string" ? err.message : JSON.stringify(res.body);
  el.textContent = "";
  const strong = document.createElement("strong");
  strong.textContent = res.status ? `${res.status} ${res.statusText || ""}`.trim() + ": " : "Error: ";
  el.append(strong, document.createTextNode(msg));
  el.hidden = false;
  el.scrollIntoView({ block: "nearest" });
}

function busy(form, on) {
  form.setAttribute("aria-busy", on ? "true" : "false");
  for (const b of form.querySelectorAll("button")) b.disabled = on;
}

/** Count finished requests (shown or failed) on <body>, so that a test can wait for the next one. */
function settled() {
  document.body.dataset.settled = String((parseInt(document.body.dataset.settled || "0", 10) || 0) + 1);
}

// ---------------------------------------------------------------- SVG plots

function svgEl(name, attrs, parent) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}

/** About n round tick values covering [lo, hi]. */
function ticks(lo, hi, n) {
  const raw = (hi - lo) / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => raw <= s) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

function domain(values) {
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (!isFinite(lo) || !isFinite(hi)) return [0, 1];
  if (lo === hi) {
    const d = Math.abs(lo) * 0.1 || 1;
    return [lo - d, hi + d];
  }
  const pad = (hi - lo) * 0.06;
  return [lo - pad, hi + pad];
}

/**
 * A line-and-dot plot with labeled axes.
 * opts: {title, xlabel, ylabel, series: [{name, color, points: [[x, y], ...]}], refY, shade: [x0, x1], integerX, keys}
 */
function linePlot(container, opts) {
  const W = 380, H = 250, M = { l: 58, r: 14, t: 44, b: 44 };
  container.textContent = "";
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.title, class: "chart" }, container);
  svgEl("title", {}, svg).textContent = opts.title;
  const xs = opts.series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = opts.series.flatMap((s) => s.points.map((p) => p[1]));
  if (opts.refY !== undefined) ys.push(opts.refY);
  let [x0, x1] = xs.length ? [Math.min(...xs), Math.max(...xs)] : [0, 1];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const xpad = (x1 - x0) * 0.03;
  [x0, x1] = [x0 - xpad, x1 + xpad];
  const [y0, y1] = domain(ys);
  const sx = (x) => M.l + ((x - x0) / (x1 - x0)) * (W - M.l - M.r);
  const sy = (y) => H - M.b - ((y - y0) / (y1 - y0)) * (H - M.t - M.b);

  const grid = svgEl("g", { class: "grid" }, svg);
  if (opts.shade) {
    const [a, b] = opts.shade;
    svgEl("rect", { x: sx(a), y: M.t, width: Math.max(1, sx(b) - sx(a)), height: H - M.t - M.b, class: "shade" }, grid);
    svgEl("text", { x: sx(a) + 3, y: H - M.b - 5, class: "shade-label" }, grid).textContent = "padding";
  }
  for (const t of ticks(y0, y1, 5)) {
    svgEl("line", { x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t) }, grid);
    svgEl("text", { x: M.l - 6, y: sy(t) + 3.5, class: "tick", "text-anchor": "end" }, svg).textContent = fmt(t);
  }
  const xt = ticks(x0, x1, 6).filter((t) => !opts.integerX || Number.isInteger(t));
  for (const t of xt) {
    svgEl("line", { x1: sx(t), x2: sx(t), y1: H - M.b, y2: H - M.b + 4, class: "axis" }, svg);
    svgEl("text", { x: sx(t), y: H - M.b + 15, class: "tick", "text-anchor": "middle" }, svg).textContent = fmt(t);
  }
  if (opts.refY !== undefined && opts.refY > y0 && opts.refY < y1) {
    svgEl("line", { x1: M.l, x2: W - M.r, y1: sy(opts.refY), y2: sy(opts.refY), class: "ref" }, svg);
  }
  svgEl("path", { d: `M${M.l},${M.t}V${H - M.b}H${W - M.r}`, class: "axis" }, svg);
  svgEl("text", { x: M.l, y: 18, class: "title" }, svg).textContent = opts.title;
  svgEl("text", { x: (M.l + W - M.r) / 2, y: H - 8, class: "label", "text-anchor": "middle" }, svg).textContent = opts.xlabel;
  const yl = svgEl("text", { x: 0, y: 0, class: "label", "text-anchor": "middle" }, svg);
  yl.setAttribute("transform", `translate(14 ${(M.t + H - M.b) / 2}) rotate(-90)`);
  yl.textContent = opts.ylabel;

  for (const s of opts.series) {
    const g = svgEl("g", { class: "series", "data-series": s.name, stroke: s.color, fill: s.color }, svg);
    svgEl("title", {}, g).textContent = s.name;
    if (s.points.length > 1) {
      const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join("");
      svgEl("path", { d, fill: "none", "stroke-width": 1.6 }, g);
    }
    if (s.points.length <= 160) {
      for (const p of s.points) svgEl("circle", { cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 2.6 }, g);
    }
  }
  if (opts.keys) {
    opts.series.forEach((s, i) => {
      const y = 16 + i * 13;
      svgEl("line", { x1: W - M.r - 58, x2: W - M.r - 44, y1: y - 3.5, y2: y - 3.5, stroke: s.color, "stroke-width": 2.5 }, svg);
      svgEl("text", { x: W - M.r - 40, y, class: "label" }, svg).textContent = s.name;
    });
  }
  return svg;
}

function legend(el, items) {
  el.textContent = "";
  for (const it of items) {
    const span = document.createElement("span");
    span.className = "key";
    const sw = document.createElement("i");
    sw.style.background = it.color;
    span.append(sw, document.createTextNode(it.name));
    el.append(span);
  }
}

// ---------------------------------------------------------------- /normalize view

function updateFormula() {
  const mode = $("eps-mode").value;
  const den = mode === "var" ? "√(var + ε)" : "(√var + ε)";
  $("formula").textContent = `y = γ · (x − mean) / ${den} + β, over the last ${$("k").value || 1} dim(s)`;
}

/** The request body; the textareas' text is sent as typed so that the service judges it and names what is wrong.
 *  `boxes` says where each textarea's text sits in the body, so that a JSON error can be shown in the user's text. */
function normalizeBody(validate) {
  const raw = $("data").value.trim();
  const parsed = tryParse(raw);
  const k = parseInt($("k").value, 10) || 1;
  const body = jsonObject();
  body.add("data", raw || "null", raw ? "data" : null);
  if (parsed.ok) {
    const shape = shapeOf(parsed.value);
    if (k > shape.length) return { error: `normalized dims k = ${k} exceeds the tensor's rank ${shape.length}` };
    body.add("normalized_shape", JSON.stringify(shape.slice(shape.length - k)));
  }
  addModel(body, $("ln-model").value);
  const eps = Number($("eps").value);
  body.add("eps", $("eps").value.trim() === "" || isNaN(eps) ? JSON.stringify($("eps").value) : String(eps));
  body.add("eps_mode", JSON.stringify($("eps-mode").value));
  body.add("backend", JSON.stringify($("backend").value));
  for (const name of ["gamma", "beta"]) {
    const text = $(name).value.trim();
    if (text) body.add(name, text, name);
  }
  if (validate) body.add("validate", "true");
  return { text: body.text(), boxes: body.boxes, data: parsed.ok ? parsed.value : null, k };
}

/** A JSON object written member by member; `boxes` records where each textarea's text lands in it. */
function jsonObject() {
  const members = [];
  const boxes = [];
  let length = 1; // "{"
  return {
    boxes,
    add(key, valueText, box) {
      const head = (members.length ? ", " : "") + JSON.stringify(key) + ": ";
      if (box) boxes.push({ box, start: length + head.length, text: valueText });
      members.push(head + valueText);
      length += head.length + valueText.length;
    },
    text: () => "{" + members.join("") + "}",
  };
}

/** Where the service's "not valid JSON (… (char N))" about the body falls in the user's own textarea, or null:
 *  {box, line, column, token, start, end}, with an empty token when the box's text ended before its JSON did. */
function locateJsonError(message, bodyText, boxes) {
  const m = /^body: not valid JSON \(.*\(char (\d+)\)\)$/.exec(message);
  if (!m) return null;
  let at = 0; // the service counts characters (code points); JavaScript strings count UTF-16 units
  for (let c = 0; c < Number(m[1]) && at < bodyText.length; c++) at += bodyText.codePointAt(at) > 0xffff ? 2 : 1;
  // Everything between the boxes is valid JSON written here: an error past a box's end is that box's, unclosed.
  const span = boxes.filter((b) => b.start <= at).pop();
  if (!span) return null;
  const value = $(span.box).value;
  const offset = Math.min(at - span.start, span.text.length);
  const start = value.length - value.trimStart().length + offset; // the box's text was sent trimmed
  const before = value.slice(0, start);
  const rest = span.text.slice(offset);
  const token = rest ? (/^[^\s,[\]{}:]{1,24}/.exec(rest) || [rest[0]])[0] : "";
  const column = [...before.slice(before.lastIndexOf("\n") + 1)].length + 1;
  return { box: span.box, line: before.split("\n").length, column, token, start, end: start + token.length };
}

/** Point at a JSON error in the user's textarea: say where under the error, and select it in the box. */
function showErrorPlace(where) {
  const el = $("error-where");
  el.hidden = !where;
  if (!where) return;
  el.textContent = where.token
    ? `In the ${where.box} box: line ${where.line}, column ${where.column}, at “${where.token}”.`
    : `In the ${where.box} box: its text ends at line ${where.line}, column ${where.column}, before its JSON does.`;
  const box = $(where.box);
  const details = box.closest("details");
  if (details) details.open = true; // gamma and beta are folded away by default
  box.focus();
  box.setSelectionRange(where.start, where.end);
}

/** The answer's warnings (rows float32 rounded together), as a list above the results; hidden when none. */
function renderWarnings(warnings) {
  const list = $("warnings");
  list.replaceChildren(
    ...(warnings || []).map((w) => {
      const li = document.createElement("li");
      li.textContent = w;
      return li;
    }),
  );
  list.hidden = !list.childElementCount;
}

async function runNormalize(validate) {
  const form = $("normalize-form");
  $("error").hidden = $("error-where").hidden = true;
  const req = normalizeBody(validate);
  if (req.error) {
    showError($("error"), { status: 0, body: { error: req.error } });
    settled();
    return;
  }
  busy(form, true);
  $("status").textContent = "Running…";
  const res = await post("normalize", req.text);
  busy(form, false);
  if (!res.ok) {
    // Results of an earlier request next to this error would read as its answer.
    $("normalize-results").hidden = $("validation").hidden = $("warnings").hidden = true;
    showError($("error"), res);
    if (res.status === 400) showErrorPlace(locateJsonError(res.body.error, req.text, req.boxes));
    $("status").textContent = "The service rejected the request.";
    settled();
    return;
  }
  renderNormalize(req.data, req.k, res);
  settled();
}

function renderNormalize(data, k, res) {
  const b = res.body;
  const shape = b.shape;
  const lead = shape.slice(0, shape.length - k);
  const rows = prod(lead);
  const cols = prod(shape.slice(shape.length - k));
  const x = flatten(data);
  const y = flatten(b.output);
  const mean = flatten(b.stats.mean);
  const std = flatten(b.stats.std);
  const vr = flatten(b.stats.var);
  const model = b.model ? ` · model ${b.model.name} v${b.model.version} (sha256 ${b.model.sha256.slice(0, 8)}…)` : "";
  $("status").textContent = `${b.backend} · shape [${shape.join(", ")}] · ${rows} row(s) of ${cols}${model}`;
  $("status").title = `round trip ${res.ms.toFixed(1)} ms`;
  renderValidation("", b.validation);
  renderWarnings(b.warnings);
  renderOutputTable(y, rows, cols, lead);
  renderStatsTable(mean, std, vr, rows, lead);
  renderNormalizePlots(x, y, mean, std, rows, cols, lead);
  $("normalize-results").hidden = false;
}

function renderValidation(prefix, v) {
  const box = $(prefix + "validation");
  if (!v) {
    box.hidden = true;
    return;
  }
  $(prefix + "val-reference").textContent = v.reference;
  $(prefix + "val-max-abs-diff").textContent = v.max_abs_diff.toExponential(3);
  $(prefix + "val-atol").textContent = v.atol.toExponential(3);
  const passed = $(prefix + "val-passed");
  passed.textContent = String(v.passed);
  passed.className = v.passed ? "pass" : "fail";
  box.hidden = false;
}

function cell(tag, text, attrs) {
  const el = document.createElement(tag);
  el.textContent = text;
  for (const [key, val] of Object.entries(attrs || {})) el.setAttribute(key, String(val));
  return el;
}

function renderOutputTable(y, rows, cols, lead) {
  const table = $("output-table");
  table.textContent = "";
  const shownRows = Math.min(rows, MAX_TABLE_ROWS);
  const shownCols = Math.min(cols, MAX_TABLE_COLS);
  const head = table.createTHead().insertRow();
  head.append(cell("th", "row", { scope: "col" }));
  for (let c = 0; c < shownCols; c++) head.append(cell("th", String(c), { scope: "col" }));
  const body = table.createTBody();
  for (let r = 0; r < shownRows; r++) {
    const tr = body.insertRow();
    tr.append(cell("th", rowLabel(r, lead), { scope: "row" }));
    for (let c = 0; c < shownCols; c++) {
      const v = y[r * cols + c];
      tr.append(cell("td", fmt(v), { id: `out-${r}-${c}`, class: "out", "data-row": r, "data-col": c, "data-value": v, title: String(v) }));
    }
  }
  const cut = rows > shownRows || cols > shownCols;
  $("output-note").textContent = cut ? `Showing ${shownRows} of ${rows} rows and ${shownCols} of ${cols} columns.` : "";
}

function renderStatsTable(mean, std, vr, rows, lead) {
  const table = $("stats-table");
  table.textContent = "";
  const head = table.createTHead().insertRow();
  for (const h of ["row", "mean", "std", "var"]) head.append(cell("th", h, { scope: "col" }));
  const body = table.createTBody();
  for (let r = 0; r < Math.min(rows, MAX_TABLE_ROWS); r++) {
    const tr = body.insertRow();
    tr.append(cell("th", rowLabel(r, lead), { scope: "row" }));
    tr.append(cell("td", fmt(mean[r]), { id: `mean-${r}`, class: "mean", "data-value": mean[r], title: String(mean[r]) }));
    tr.append(cell("td", fmt(std[r]), { id: `std-${r}`, class: "std", "data-value": std[r], title: String(std[r]) }));
    tr.append(cell("td", fmt(vr[r]), { id: `var-${r}`, class: "var", "data-value": vr[r], title: String(vr[r]) }));
  }
}

function renderNormalizePlots(x, y, mean, std, rows, cols, lead) {
  const shown = Math.min(rows, MAX_PLOTTED_ROWS);
  const series = (values) =>
    Array.from({ length: shown }, (_, r) => ({
      name: `row ${rowLabel(r, lead)}`,
      color: PALETTE[r],
      points: Array.from({ length: cols }, (_, c) => [c, values[r * cols + c]]),
    }));
  const xlabel = "column (flattened last k dims)";
  if (x.length === y.length) {
    linePlot($("plot-before"), { title: "Before: input x", xlabel, ylabel: "value", series: series(x), integerX: true });
  } else {
    $("plot-before").textContent = "";
  }
  linePlot($("plot-after"), { title: "After: normalized output", xlabel, ylabel: "value", series: series(y), refY: 0, integerX: true });
  const idx = (vals) => vals.map((v, r) => [r, v]);
  linePlot($("plot-stats"), {
    title: "Mean and std of each row of x",
    xlabel: "row (flat index)",
    ylabel: "statistic",
    series: [
      { name: "mean", color: "#1f5f99", points: idx(mean) },
      { name: "std", color: "#d1495b", points: idx(std) },
    ],
    refY: 0,
    integerX: true,
    keys: true,
  });
  const items = series(y).map((s) => ({ name: s.name, color: s.color }));
  if (rows > shown) items.push({ name: `(first ${shown} of ${rows} rows plotted)`, color: "transparent" });
  legend($("legend"), items);
}

function useExample(id) {
  const ex = EXAMPLES[id];
  $("data").value = ex.data;
  $("eps").value = ex.eps;
  $("eps-mode").value = ex.mode;
  $("k").value = ex.k;
  updateFormula();
}

function generate() {
  const rows = Math.max(1, parseInt($("gen-rows").value, 10) || 1);
  const cols = Math.max(1, parseInt($("gen-cols").value, 10) || 1);
  const offset = Number($("gen-offset").value) || 0;
  const scale = Number($("gen-scale").value);
  const z = normals(rows * cols, parseInt($("gen-seed").value, 10) || 0);
  const lines = [];
  for (let r = 0; r < rows; r++) {
    const row = z.slice(r * cols, (r + 1) * cols).map((v) => +(offset + (isNaN(scale) ? 1 : scale) * v).toFixed(4));
    lines.push("  " + JSON.stringify(row).replace(/,/g, ", "));
  }
  $("data").value = "[\n" + lines.join(",\n") + "\n]";
  $("k").value = 1;
  updateFormula();
}

// ---------------------------------------------------------------- /encode view

/** d_model of each encoder the picker lists (from its metadata); 128 for the default ones. */
const D_MODELS = new Map();

/** "name" or "name@version" from a picker: the request's `model` and, if pinned, `version` fields. */
function addModel(body, choice) {
  const [name, version] = choice.split("@");
  body.add("model", JSON.stringify(name));
  if (version) body.add("version", version);
}

/** The pickers, from the repository index (every READY version); the index is an admin route, closed to
 * the page (403 without NORMSERVE_ADMIN_TOKEN, 401 without the header), and the statistics of the serving
 * models stand in for it. The text view's picker lists /v1/models, the text encoders. */
async function loadModels() {
  let ready = [];
  const index = await fetch("v2/repository/index", { method: "POST" }).catch(() => null);
  if (index && index.ok) {
    ready = (await index.json()).filter((m) => m.state === "READY").map((m) => [m.name, m.version]);
  } else {
    const stats = await fetch("v2/models/stats").then((r) => (r.ok ? r.json() : { model_stats: [] }));
    ready = stats.model_stats.map((m) => [m.name, m.version]);
  }
  const byName = new Map();
  for (const [name, version] of ready) byName.set(name, [...(byName.get(name) || []), version]);
  const picked = { layernorm: [], encoder: [], monitor: [...byName] };
  for (const [name, versions] of byName) {
    const meta = await fetch(`v2/models/${encodeURIComponent(name)}`).then((r) => (r.ok ? r.json() : null));
    if (!meta) continue;
    const kind = modelKind(meta);
    if (kind === "encoder") {
      const input = meta.inputs.find((t) => t.name === "input");
      D_MODELS.set(name, input.shape[input.shape.length - 1]);
    }
    if (kind in picked) picked[kind].push([name, versions]);
  }
  for (const select of document.querySelectorAll("select[data-kind]")) fillPicker(select, picked[select.dataset.kind]);
  const text = await fetch("v1/models").then((r) => (r.ok ? r.json() : { data: [] }));
  // /v1/embeddings names no version: the serving one answers
  fillPicker($("text-model"), text.data.map((m) => [m.id, (byName.get(m.id) || []).slice(-1)]));
}

/** A model's kind by its V2 inputs: a text encoder takes `text`, an encoder a `padding_mask` beside its input. */
function modelKind(meta) {
  const names = meta.inputs.map((t) => t.name);
  return names.includes("text") ? "text-encoder" : names.includes("padding_mask") ? "encoder" : "layernorm";
}

/** Fill a picker with [name, versions] (latest last): each name, and each version when there are several. */
function fillPicker(select, models) {
  if (!models.length) return; // the picker keeps its default
  const current = select.value;
  select.replaceChildren();
  for (const [name, versions] of models) {
    const latest = versions.length ? ` (latest: v${versions[versions.length - 1]})` : "";
    select.append(new Option(name + latest, name, false, name === current));
    if (versions.length > 1) for (const v of versions) select.append(new Option(`${name} v${v}`, `${name}@${v}`));
  }
}

async function runEncode() {
  const form = $("encode-form");
  $("enc-error").hidden = true;
  const seq = parseInt($("enc-seq").value, 10) || 1;
  const pad = Math.max(0, parseInt($("enc-pad").value, 10) || 0);
  const scale = Number($("enc-scale").value);
  const [name, version] = $("enc-model").value.split("@");
  const d = D_MODELS.get(name) || 128;
  const z = normals(seq * d, parseInt($("enc-seed").value, 10) || 0);
  const data = Array.from({ length: seq }, (_, t) =>
    z.slice(t * d, (t + 1) * d).map((v) => +((isNaN(scale) ? 1 : scale) * v).toFixed(5)),
  );
  const req = { data, model: name };
  if (version) req.version = Number(version);
  if (pad > 0) req.padding_mask = Array.from({ length: seq }, (_, t) => t >= seq - pad);
  if ($("enc-validate").checked) req.validate = true;
  const view = { form, status: "enc-status", error: "enc-error", results: ["encode-results", "enc-validation"] };
  await exchange(view, () => post("encode", JSON.stringify(req)), (res) => renderEncode(res, seq, pad));
}

/** Send a view's request with its form busy, then show the service's error (hiding the view's earlier results,
 *  which would read as this request's answer) or render its answer; either way count the request settled. */
async function exchange(view, request, render) {
  busy(view.form, true);
  $(view.status).textContent = "Running…";
  const res = await request();
  busy(view.form, false);
  if (res.ok) {
    render(res);
  } else {
    for (const id of view.results) $(id).hidden = true;
    showError($(view.error), res);
    $(view.status).textContent = "The service rejected the request.";
  }
  settled();
}

function renderEncode(res, seq, pad) {
  const b = res.body;
  const m = b.model;
  $("enc-status").textContent =
    `${m.name} v${m.version} · output [${b.shape.join(", ")}] · ${b.layer_norms.length} LayerNorms`;
  $("enc-status").title = `round trip ${res.ms.toFixed(1)} ms`;
  renderValidation("enc-", b.validation);
  const series = (key) =>
    b.layer_norms.map((ln, i) => ({ name: ln.name, color: PALETTE[i % PALETTE.length], points: flatten(ln[key]).map((v, t) => [t, v]) }));
  const shade = pad > 0 && pad <= seq ? [seq - pad - 0.5, seq - 0.5] : undefined;
  const xlabel = "position";
  linePlot($("enc-plot-mean"), { title: "Mean of each LayerNorm's input", xlabel, ylabel: "mean", series: series("mean"), shade, refY: 0, integerX: true });
  linePlot($("enc-plot-std"), { title: "Std of each LayerNorm's input", xlabel, ylabel: "std", series: series("std"), shade, integerX: true });
  legend($("enc-legend"), b.layer_norms.map((ln, i) => ({ name: ln.name, color: PALETTE[i % PALETTE.length] })));
  $("encode-results").hidden = false;
}

// ---------------------------------------------------------------- /v1/embeddings (text) view

/** "3: A kitten is…": a sentence's index and first words, to label it in the heatmap and the plots. */
function sentenceLabel(text, i) {
  const words = text.split(/\s+/).filter(Boolean);
  return `${i}: ${words.slice(0, 3).join(" ")}${words.length > 3 ? "…" : ""}`;
}

/** Cosine similarity of every pair of rows, in float64. */
function cosineMatrix(rows) {
  const norms = rows.map((r) => Math.sqrt(r.reduce((a, v) => a + v * v, 0)));
  return rows.map((a, i) => rows.map((b, j) => a.reduce((acc, v, k) => acc + v * b[k], 0) / (norms[i] * norms[j])));
}

/** A diverging colour for a cosine: blue at -1, white at 0, red at 1. */
function heatColour(v) {
  const t = Math.max(-1, Math.min(1, v));
  const [r, g, b] = t >= 0 ? [209, 73, 91] : [31, 95, 153];
  const mix = (c) => Math.round(255 + (c - 255) * Math.abs(t));
  return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
}

async function runText() {
  const form = $("text-form");
  $("text-error").hidden = true;
  const texts = $("text-input").value.split("\n").map((t) => t.trim()).filter(Boolean);
  const model = $("text-model").value;
  const refused = !model ? "no text encoder is served: export one with `normserve export text-encoder`" :
    !texts.length ? "type at least one sentence" : null;
  if (refused) {
    $("text-results").hidden = true;
    showError($("text-error"), { status: 0, body: { error: refused } });
    settled();
    return;
  }
  const req = { model, input: texts, encoding_format: "float", return_layer_norms: true };
  const view = { form, status: "text-status", error: "text-error", results: ["text-results"] };
  await exchange(view, () => post("v1/embeddings", JSON.stringify(req)), (res) => renderText(texts, res));
}

function renderText(texts, res) {
  const b = res.body;
  const labels = texts.map(sentenceLabel);
  const width = b.data.length ? b.data[0].embedding.length : 0;
  $("text-status").textContent = `${b.model} · ${texts.length} sentence(s) · width ${width} · ${b.usage.prompt_tokens} tokens`;
  $("text-status").title = `round trip ${res.ms.toFixed(1)} ms`;
  renderHeatmap(cosineMatrix(b.data.map((d) => d.embedding)), labels);
  const plots = $("text-ln-plots");
  plots.textContent = "";
  const names = b.data.length ? b.data[0].layer_norms.map((ln) => ln.name) : [];
  names.forEach((name, j) => {
    const figure = document.createElement("figure");
    const div = document.createElement("div");
    div.id = `text-ln-${j}`;
    div.className = "plot";
    div.dataset.layer = name;
    figure.append(div);
    plots.append(figure);
    const series = b.data.map((d, i) => ({
      name: labels[i],
      color: PALETTE[i % PALETTE.length],
      points: d.layer_norms[j].std.map((v, t) => [t, v]),
    }));
    linePlot(div, { title: name, xlabel: "token", ylabel: "std of the input", series, integerX: true });
  });
  legend($("text-legend"), labels.map((name, i) => ({ name, color: PALETTE[i % PALETTE.length] })));
  $("text-results").hidden = false;
}

function renderHeatmap(sims, labels) {
  const table = $("text-heatmap");
  table.textContent = "";
  const head = table.createTHead().insertRow();
  head.append(cell("th", "", { scope: "col" }));
  labels.forEach((l, j) => head.append(cell("th", String(j), { scope: "col", title: l })));
  const body = table.createTBody();
  sims.forEach((row, i) => {
    const tr = body.insertRow();
    tr.append(cell("th", labels[i], { scope: "row" }));
    row.forEach((v, j) => {
      const td = cell("td", v.toFixed(3), { class: "sim", "data-row": i, "data-col": j, "data-value": v, title: String(v) });
      td.style.background = heatColour(v);
      if (Math.abs(v) > 0.6) td.classList.add("dark");
      tr.append(td);
    });
  });
}

// ---------------------------------------------------------------- /v2/models/{name}/monitor view

async function runMonitor() {
  const form = $("monitor-form");
  $("mon-error").hidden = true;
  const [name, version] = $("mon-model").value.split("@");
  const path = `v2/models/${encodeURIComponent(name)}` + (version ? `/versions/${encodeURIComponent(version)}` : "");
  const view = { form, status: "mon-status", error: "mon-error", results: ["mon-results"] };
  await exchange(view, () => send(path + "/monitor", { method: "GET" }), (res) => renderMonitor(res.body));
}

function renderMonitor(b) {
  $("mon-status").textContent = `${b.model} v${b.version} · window ${b.window_s} s · ${b.layers.length} LayerNorm(s)`;
  // A version without a baseline has no layers to report, and its `baseline` is the service's explanation.
  const counts = b.layers.map((l) => l.baseline.count);
  const base = $("mon-baseline");
  base.className = "baseline" + (b.layers.length ? "" : " none");
  base.textContent = b.layers.length
    ? `Baseline: ${b.baseline} (${Math.max(...counts)} positions).`
    : `Exported before baselines: none. The service says: “${b.baseline}”.`;
  const table = $("mon-table");
  table.textContent = "";
  table.hidden = !b.layers.length; // an empty table's header would read as a window with no layers
  const head = table.createTHead().insertRow();
  for (const h of ["LayerNorm", "PSI", "reading", "window samples", "window vs baseline"]) head.append(cell("th", h, { scope: "col" }));
  const body = table.createTBody();
  for (const layer of b.layers) {
    const tr = body.insertRow();
    tr.dataset.layer = layer.name;
    const empty = layer.samples === 0 || layer.psi === null;
    const reading = empty ? "no samples" : layer.verdict;
    tr.append(cell("th", layer.name, { scope: "row" }));
    tr.append(cell("td", empty ? "—" : layer.psi.toFixed(3), { class: "psi", "data-value": empty ? "" : layer.psi }));
    tr.append(cell("td", reading, { class: "verdict " + (empty ? "nodata" : layer.verdict) }));
    tr.append(cell("td", empty ? "no samples" : String(layer.samples), { class: "samples", "data-value": layer.samples }));
    const bars = cell("td", "", { class: "bars" });
    fractionBars(bars, layer.live);
    tr.append(bars);
  }
  $("mon-results").hidden = false;
}

/** The window's fraction in each PSI bin beside the baseline's, as small paired bars. */
function fractionBars(container, live) {
  const total = live.counts.reduce((a, c) => a + c, 0);
  const actual = live.counts.map((c) => (total ? c / total : 0));
  const n = live.expected.length;
  const W = 12 * n, H = 28;
  const top = Math.max(...actual, ...live.expected, 1e-9);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "bars-chart", role: "img" }, container);
  svgEl("title", {}, svg).textContent = "per std bin: baseline (grey) and window (colour) fractions";
  live.expected.forEach((e, i) => {
    const he = (e / top) * H, ha = (actual[i] / top) * H;
    svgEl("rect", { x: i * 12 + 1, y: H - he, width: 5, height: he, class: "expected" }, svg);
    svgEl("rect", { x: i * 12 + 6, y: H - ha, width: 5, height: ha, class: "actual" }, svg);
  });
}

// ---------------------------------------------------------------- wiring

function selectTab(tab) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  tab.focus();
}

function wire() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  for (const t of tabs) {
    t.addEventListener("click", () => selectTab(t));
    t.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (step) selectTab(tabs[(tabs.indexOf(t) + step + tabs.length) % tabs.length]);
    });
  }
  for (const id of Object.keys(EXAMPLES)) $(id).addEventListener("click", () => useExample(id));
  $("generate").addEventListener("click", generate);
  $("eps-mode").addEventListener("change", updateFormula);
  $("k").addEventListener("input", updateFormula);
  $("normalize-form").addEventListener("submit", (e) => {
    e.preventDefault();
    runNormalize(false);
  });
  $("compare").addEventListener("click", () => runNormalize(true));
  for (const [form, run] of [["encode-form", runEncode], ["text-form", runText], ["monitor-form", runMonitor]]) {
    $(form).addEventListener("submit", (e) => {
      e.preventDefault();
      run();
    });
  }
  updateFormula();
  document.body.dataset.settled = "0";
  loadModels()
    .catch(() => {}) // the pickers keep the default models
    .finally(() => {
      document.body.dataset.ready = "true"; // tests wait for this before clicking
    });
}

document.addEventListener("DOMContentLoaded", wire);
