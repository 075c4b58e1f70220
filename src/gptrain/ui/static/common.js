// Shared by every page: DOM building (text only: nothing from the server becomes HTML),
// JSON calls, POST actions with the CSRF token, Server-Sent Events, number formats, charts.
"use strict";
const gp = window.gp = { CSRF: document.querySelector('meta[name=csrf]').content,
  R: JSON.parse(document.querySelector('meta[name=render]').content) };  // gptrain/assets/render.json + jobs/api.FACTS

gp.el = function (tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const k of kids.flat()) if (k !== undefined && k !== null) e.append(k instanceof Node ? k : String(k));
  return e;
};

gp.get = async function (url) {
  const r = await fetch(url);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || `${url}: HTTP ${r.status}`);
  return body;
};

gp.post = async function (url, body) {
  const headers = { "X-CSRF-Token": gp.CSRF };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(url, { method: "POST", headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(answer.error || `HTTP ${r.status}`);
  return answer;
};

// Streams are closed when the page goes away: a browser holds at most 6 connections to one
// host, and streams left open would make the next pages wait for a free one.
gp.streams = new Set();
window.addEventListener("pagehide", () => { for (const es of gp.streams) es.close(); gp.streams.clear(); });

gp.listen = function (url, handlers) {
  const es = new EventSource(url);
  gp.streams.add(es);
  const close = es.close.bind(es);
  es.close = () => { gp.streams.delete(es); close(); };
  for (const [event, fn] of Object.entries(handlers)) es.addEventListener(event, (e) => fn(JSON.parse(e.data)));
  es.onopen = () => gp.status("live");
  es.onerror = () => gp.status("reconnecting…");
  return es;
};

gp.status = (text) => { document.getElementById("status").textContent = text; };
// Numbers as the CLI shows them (cli/render.py): one spec, gp.R
gp.missing = (v) => v === null || v === undefined;
gp.loss = (v) => (gp.missing(v) ? gp.R.missing : Number(v).toFixed(gp.R.loss_decimals));
gp.plain = (v) => (gp.missing(v) ? gp.R.missing : String(v));
gp.count = (n) => (gp.missing(n) ? gp.R.missing : Number(n).toLocaleString("en-US"));
gp.bytes = function (n) {
  if (gp.missing(n)) return gp.R.missing;
  for (const [u, s] of gp.R.size_units) if (n >= s) return (n / s).toFixed(gp.R.size_decimals) + " " + u;
  return Math.trunc(n) + " " + gp.R.size_bytes_unit;
};
gp.age = (t) => (t ? gp.duration(Math.max(Date.now() / 1000 - t, 0)) : gp.R.missing);
gp.duration = function (s) {
  if (gp.missing(s)) return gp.R.missing;
  for (const [u, n] of gp.R.age_units) if (s >= n) return Math.floor(s / n) + u;
  return Math.floor(s) + gp.R.age_seconds_unit;
};
gp.steps = (step, total) => (gp.missing(step) ? gp.R.missing : gp.missing(total) ? String(step) : `${step}/${total}`);
gp.tick = (v, digits = 1) => (v === null ? "" : v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-2) ? v.toExponential(digits) : String(+v.toPrecision(digits + 2)));
// An axis's labels with as many digits as it takes to tell them apart (a learning-rate axis
// from 2.00e-3 to 2.10e-3 read "2.0e-3" three times).
gp.ticks = function (vals) {
  for (let digits = 1; digits < 6; digits++) {
    const out = vals.map((v) => gp.tick(v, digits)), shown = out.filter((s) => s !== "");
    if (new Set(shown).size === shown.length) return out;
  }
  return vals.map((v) => gp.tick(v, 6));
};
gp.nodes = (j) => (j.min_nodes ? `${j.min_nodes}:${j.nodes}` : String(j.nodes)); // elastic: MIN:MAX, as typed
gp.time = function (t) {  // local YYYY-MM-DD HH:MM:SS
  if (!t) return gp.R.missing;
  const d = new Date(t * 1000), p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
};
gp.stateBadge = (s) => gp.el("span", { class: "state " + s }, s);
gp.COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];

// A line chart: series = [{label, color}], data = [xs, ys1, ys2...] (uPlot's column layout).
gp.chart = function (parent, title, xLabel, series, data) {
  const box = gp.el("div", { class: "chart" });
  parent.append(box);
  const opts = {
    title, width: Math.max(320, Math.min(660, parent.clientWidth / 2 - 24)), height: 240,
    scales: { x: { time: false } }, axes: [{ label: xLabel }, { size: 64, values: (u, vals) => gp.ticks(vals) }],
    series: [{ label: xLabel }, ...series.map((s, i) => ({
      label: s.label, stroke: s.color || gp.COLORS[i % gp.COLORS.length], width: 1.5, spanGaps: true,
      ...(s.points ? { points: { show: true, size: 6 } } : {}) }))],
  };
  return new uPlot(opts, data || [[], ...series.map(() => [])], box);
};

// Curves {x: [...], y: [...]} with different xs joined into one uPlot table (gaps as null).
gp.join = (curves) => (curves.length ? uPlot.join(curves.map((c) => [c.x, c.y])) : [[]]);

// A run's form (a new run, or a job run again with changes): name, flags, config; the server
// checks it as `gptrain run` does and answers its one-line error, shown under the form.
gp.runForm = function (id, fields, submit) {
  const name = gp.el("input", { id: id + "-name", size: 30, value: fields.name || "" });
  const extra = fields.dataset !== undefined ? gp.el("select", { id: id + "-dataset" }) : null;
  const args = gp.el("textarea", { id: id + "-args", rows: 4, cols: 80 });
  args.value = fields.args || "";
  const config = gp.el("textarea", { id: id + "-config", rows: 8, cols: 80 });
  config.value = fields.config || "";
  const err = gp.el("p", { id: id + "-error", class: "error" });
  const where = fields.engine ? gp.engineFields(id) : null;
  const go = gp.el("button", { id: id + "-submit", onclick: async () => {
    err.textContent = "";
    go.disabled = true;
    try {
      const r = await gp.post(submit.url, { name: name.value, args: args.value, config: config.value || null,
        ...(extra ? { dataset: extra.value } : {}), ...(where ? where.values() : {}) });
      location.href = "/jobs/" + encodeURIComponent(r.name);
    } catch (e) { err.textContent = e.message; } finally { go.disabled = false; }
  } }, submit.label);
  const form = gp.el("div", { class: "form", id }, gp.el("label", {}, "name ", name),
    extra ? gp.el("label", {}, " dataset ", extra) : "", where ? where.box : "", gp.el("div", {}, gp.el("label", { for: args.id }, fields.argsLabel)),
    args, gp.el("div", {}, gp.el("label", { for: config.id }, "config (TOML)")), config, gp.el("div", {}, go), err);
  return { form, name, args, config, dataset: extra, where };
};

// Where a new run goes: the scheduler, nodes and processes per node, and the chosen engine's
// options as jobs/engines/options.py declares them (served in gp.R.engine_options).
gp.engineFields = function (id) {
  const scheduler = gp.el("select", { id: id + "-scheduler" }, gp.el("option", { value: "" }, "(default)"),
    ...gp.R.schedulers.map((s) => gp.el("option", { value: s }, s)));
  const nodes = gp.el("input", { id: id + "-nodes", size: 8, placeholder: "1 or MIN:MAX" });
  const accels = gp.el("input", { id: id + "-accels", type: "number", min: 1, size: 4, placeholder: "1" });
  const opts = gp.el("span", { id: id + "-options" });
  let inputs = {};
  function draw() {
    inputs = {};
    opts.replaceChildren(...(gp.R.engine_options[scheduler.value] || []).map((o) => {
      const input = o.kind === "choice"
        ? gp.el("select", { id: `${id}-opt-${o.key}`, title: o.help }, gp.el("option", { value: "" }, ""),
          ...o.choices.map((c) => gp.el("option", { value: c }, c)))
        : gp.el("input", { id: `${id}-opt-${o.key}`, size: o.kind === "int" ? 6 : 16, title: o.help });
      inputs[o.key] = input;
      return gp.el("label", {}, ` ${o.flag.replace(/^--/, "")} `, input);
    }));
  }
  scheduler.addEventListener("change", draw);
  const box = gp.el("div", {}, gp.el("label", {}, "scheduler ", scheduler), gp.el("label", {}, " nodes ", nodes),
    gp.el("label", {}, " processes per node ", accels), opts);
  const values = () => ({ scheduler: scheduler.value, nodes: nodes.value, accels: accels.value,
    options: Object.fromEntries(Object.entries(inputs).map(([k, e]) => [k, e.value])) });
  return { box, values, scheduler, nodes, accels };
};
