// One job: state and failure reason, live curves, per-rank logs that follow, events, checkpoints,
// config. Curves load once (downsampled by the server), then grow by the rows the stream sends.
"use strict";
(async function () {
  const name = decodeURIComponent(location.pathname.split("/").pop());
  const api = "/api/jobs/" + encodeURIComponent(name);
  const ACTIVE = gp.R.active;  // jobs/store.py's, through jobs/api.FACTS
  const main = document.getElementById("main");
  const $ = (tag, id, ...kids) => gp.el(tag, { id }, ...kids);
  const state = $("span", "state"), error = $("p", "error"), info = $("p", "info");
  const stopBtn = gp.el("button", { id: "stop", onclick: () => act("stop") }, "stop");
  const rmBtn = gp.el("button", { id: "remove", onclick: () => confirm(`Remove job ${name} and its files?`) && act("remove") }, "remove");
  const charts = gp.el("div", { class: "charts", id: "charts" });
  const rankSel = $("select", "rank"), log = gp.el("pre", { id: "log", class: "log" });
  const events = gp.el("ul", { id: "events", class: "timeline" }), ckpts = $("tbody", "checkpoints");
  const config = $("pre", "config"), spec = $("pre", "spec");
  error.className = "error";
  // ---- try a checkpoint: text from it, through what `gptrain generate` calls
  const prompt = gp.el("textarea", { id: "prompt", rows: 3, cols: 80 });
  const maxNew = gp.el("input", { id: "max-new-tokens", type: "number", value: 40, min: 1, max: 2000 });
  const ckptSel = $("select", "try-checkpoint"), sampled = gp.el("pre", { id: "sampled" }), tryErr = gp.el("p", { id: "try-error", class: "error" });
  const tryBtn = gp.el("button", { id: "generate", onclick: async () => {
    tryErr.textContent = ""; sampled.textContent = "…"; tryBtn.disabled = true;
    try {
      const r = await gp.post(`${api}/generate`, { prompt: prompt.value, max_new_tokens: Number(maxNew.value), checkpoint: ckptSel.value });
      sampled.textContent = r.texts.join("\n---\n");
    } catch (e) { sampled.textContent = ""; tryErr.textContent = e.message; } finally { tryBtn.disabled = false; }
  } }, "generate");
  const tryBox = gp.el("div", { class: "form" }, prompt, gp.el("div", {}, gp.el("label", {}, "checkpoint ", ckptSel),
    gp.el("label", {}, " new tokens ", maxNew), " ", tryBtn), tryErr, sampled);
  // ---- run again: its flags and config in a form, submitted as `gptrain run` would
  const rerun = gp.runForm("rerun", { name: name + "-2", argsLabel: "flags after -- (trainer flags, or your program's arguments)" },
    { url: `${api}/rerun`, label: "run" });
  const rerunBox = rerun.form;
  let filled = false;
  main.append(gp.el("h1", {}, name, " ", state), gp.el("div", { class: "toolbar" }, stopBtn, rmBtn,
    gp.el("a", { href: "/compare?jobs=" + encodeURIComponent(name) }, "compare…")), error, info, charts,
    gp.el("h2", {}, "Logs ", rankSel), log, gp.el("h2", {}, "Events"), events,
    gp.el("h2", {}, "Checkpoints"), gp.el("table", {}, gp.el("thead", {}, gp.el("tr", {},
      [...gp.R.columns.checkpoints, ""].map((h) => gp.el("th", {}, h)))), ckpts),
    gp.el("h2", {}, "Resolved config"), config, gp.el("h2", {}, "Job spec"), spec,
    gp.el("h2", {}, "Try it"), tryBox, gp.el("h2", {}, "Run again with changes"), rerunBox);

  async function act(what) {
    try {
      const r = await gp.post(`${api}/${what}`);
      if (what === "remove") location.href = "/"; else gp.status(`stop: ${r.state}`);
    } catch (e) { error.textContent = `${what}: ${e.message}`; }
  }

  // ---- the record: state, error, events, checkpoints, config
  let ranks = 0;
  function showJob(d) {
    const j = d.job;
    state.replaceChildren(gp.stateBadge(j.state));
    state.dataset.state = j.state;
    error.textContent = j.error ? "failed: " + j.error : "";
    stopBtn.disabled = !ACTIVE.includes(j.state);
    rmBtn.disabled = ACTIVE.includes(j.state);
    info.textContent = `${gp.nodes(j)} node(s) x ${j.accels} accelerator(s), ${j.scheduler}` +
      ` · created ${gp.time(j.created)} · started ${gp.time(j.started)} · ended ${gp.time(j.ended)} · restarts ${j.restarts}`;
    events.replaceChildren(...d.events.map((e) => gp.el("li", {}, gp.el("time", {}, gp.time(e.time)), gp.el("b", {}, e.kind), " ", e.message)));
    ckpts.replaceChildren(...d.checkpoints.map((c) => gp.el("tr", { "data-checkpoint": c.id },
      gp.el("td", {}, c.id), gp.el("td", {}, c.name), gp.el("td", {}, c.kind ?? "-"), gp.el("td", { class: "num" }, gp.plain(c.step)), gp.el("td", { class: "num" }, gp.loss(c.train_loss)),
      gp.el("td", { class: "num" }, gp.loss(c.eval_loss)), gp.el("td", {}, gp.time(c.time)), gp.el("td", { class: "num" }, gp.bytes(c.size)),
      gp.el("td", {}, gp.el("a", { href: `${api}/checkpoints/${c.id}.zip`, class: "download" }, "zip"), " ",
        gp.el("a", { href: `${api}/checkpoints/${c.id}/hf.zip`, class: "download-hf", title: "exported as a Hugging Face model" }, "HF zip")))));
    config.textContent = d.config || "(no resolved config: the job has not started the built-in trainer)";
    const keep = ckptSel.value;
    ckptSel.replaceChildren(gp.el("option", { value: "" }, "newest"), ...d.checkpoints.map((c) => gp.el("option", { value: c.id }, c.name)));
    ckptSel.value = keep;
    if (!filled) {  // once: what the user types is never replaced by an update
      filled = true;
      rerun.args.value = (d.spec.args || []).join("\n");
      rerun.config.value = d.spec.config || "";
    }
    spec.textContent = JSON.stringify(d.spec, null, 2);
    if (d.ranks !== ranks) {
      ranks = d.ranks;
      const keep = rankSel.value || "0";
      rankSel.replaceChildren(...[...Array(ranks).keys()].map((r) => gp.el("option", { value: r }, "rank " + r)));
      rankSel.value = keep;
    }
  }

  // ---- curves
  const CHARTS = [["loss", "loss (train, eval)"], ["lr", "learning rate"], ["grad_norm", "gradient norm"],
                  ["tokens_per_s", "tokens/s"], ["mfu", "MFU"]];
  gp.charts = {};
  gp.curves = {};
  function draw() {
    for (const [key, title] of CHARTS) {
      const data = key === "loss" ? gp.join([gp.curves.loss, gp.curves.eval_loss]) : [gp.curves[key].x, gp.curves[key].y];
      if (!gp.charts[key]) {
        const series = key === "loss" ? [{ label: "train" }, { label: "eval", points: true }] : [{ label: key }];
        gp.charts[key] = gp.chart(charts, title, "step", series, data);
      } else gp.charts[key].setData(data);
    }
  }
  let stream = null;
  async function loadCurves(first) {
    if (stream) stream.close();
    gp.curves = first || await gp.get(`${api}/curves?x=step&max=2000`);
    draw();
    stream = gp.listen(`${api}/stream?train=${gp.curves.loss.total}&eval=${gp.curves.eval_loss.total}`, {
      job: showJob,
      gone: () => { stream.close(); error.textContent = "this job was removed"; },
      metrics: (m) => {
        for (const [k, c] of Object.entries(m)) {
          gp.curves[k].x.push(...c.x); gp.curves[k].y.push(...c.y); gp.curves[k].total = c.total;
        }
        if (gp.curves.loss.x.length > 8000) loadCurves(); else draw();  // downsample again
      },
    });
  }

  // ---- logs of one rank: the tail, then what is appended
  let logStream = null;
  async function followLog() {
    if (logStream) logStream.close();
    const rank = rankSel.value || "0";
    const first = await gp.get(`${api}/logs/${rank}`);
    log.textContent = first.text;
    log.scrollTop = log.scrollHeight;
    logStream = gp.listen(`${api}/logs/${rank}/stream?offset=${first.offset}`, {
      log: (d) => {
        const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent = (log.textContent + d.text).slice(-262144);
        if (atEnd) log.scrollTop = log.scrollHeight;
      },
    });
  }
  rankSel.addEventListener("change", followLog);

  const [detail, curves] = await Promise.all([gp.get(api), gp.get(`${api}/curves?x=step&max=2000`)]);
  showJob(detail);
  await loadCurves(curves);
  gp.drawnAt = performance.now();
  followLog();
})();
