// One sweep (`gptrain sweep inspect NAME`): its trials sorted by eval loss, the best named; every
// trial's eval-loss curve on one chart; and each setting against the objective (a point per
// trial: complete ones blue, pruned ones red at the best loss they reached). Redrawn every 5 s
// while the sweep's driver runs.
"use strict";
(function () {
  const name = decodeURIComponent(location.pathname.split("/").pop());
  const main = document.getElementById("main");
  const head = gp.el("p", { id: "sweep-head" });
  const body = gp.el("tbody", { id: "trials-body" });
  const table = gp.el("table", { id: "trials" }, gp.el("thead", { id: "trials-head" }), body);
  const curves = gp.el("div", { class: "charts", id: "sweep-curves" });
  const points = gp.el("div", { class: "charts", id: "sweep-scatter" });
  main.append(gp.el("h1", {}, `Sweep ${name}`), head, table, gp.el("h2", {}, "Eval loss of every trial"), curves,
    gp.el("h2", {}, "Each setting against the eval loss"), points);
  gp.sweepCharts = { scatter: {} };

  function scatter(key, space, trials) {
    const choice = space.kind === "choice";
    const at = (v) => (choice ? space.choices.indexOf(String(v)) : Number(v));
    const shown = trials.filter((t) => t.params[key] !== undefined && (t.value ?? t.best) !== null)
      .map((t) => [at(t.params[key]), t.state === "pruned" ? null : t.value, t.state === "pruned" ? t.best : null])
      .sort((a, b) => a[0] - b[0]);
    const box = gp.el("div", { class: "chart", "data-param": key });
    points.append(box);
    const dots = (color) => ({ stroke: color, fill: color, paths: () => null, points: { show: true, size: 9 } });
    return new uPlot({
      title: `${key} (${space.kind})`, width: 420, height: 260,
      scales: { x: { time: false, distr: space.kind === "loguniform" ? 3 : 1, ...(choice ? { range: [-0.5, space.choices.length - 0.5] } : {}) } },
      axes: [{ label: key, values: (u, vals) => (choice ? vals.map((v) => space.choices[v] ?? "") : gp.ticks(vals)) },
        { size: 64, label: "eval loss", values: (u, vals) => gp.ticks(vals) }],
      series: [{ label: key }, { label: "complete", ...dots(gp.COLORS[0]) }, { label: "pruned", ...dots(gp.COLORS[1]) }],
    }, [shown.map((p) => p[0]), shown.map((p) => p[1]), shown.map((p) => p[2])], box);
  }

  async function draw() {
    const r = await gp.get(`/api/sweeps/${encodeURIComponent(name)}?max=500`);
    const keys = Object.keys(r.spec.params);
    head.replaceChildren(`${r.ended} of ${r.spec.trials} trials ended (${r.pruned} pruned), ${r.spec.parallel} at once; driver ${r.driver}`,
      ...(r.best ? ["; best: ", gp.el("a", { id: "best", href: "/jobs/" + encodeURIComponent(r.best) }, r.best),
        ` (eval loss ${gp.loss(r.best_value)})`] : []));
    table.tHead.replaceChildren(gp.el("tr", {}, ["trial", "job", "state", ...keys, "eval loss", "best", "step"].map((h) => gp.el("th", {}, h))));
    body.replaceChildren(...r.trials.map((t) => gp.el("tr", { "data-trial": t.number, class: t.job === r.best ? "best" : "" },
      gp.el("td", { class: "num" }, t.number),
      gp.el("td", {}, t.job ? gp.el("a", { href: "/jobs/" + encodeURIComponent(t.job) }, t.job) : gp.R.missing),
      gp.el("td", {}, gp.stateBadge(t.shown)),
      ...keys.map((k) => gp.el("td", { class: "num" }, typeof t.params[k] === "number" ? +t.params[k].toPrecision(4) : gp.plain(t.params[k]))),
      gp.el("td", { class: "num" }, gp.loss(t.value)), gp.el("td", { class: "num" }, gp.loss(t.best)),
      gp.el("td", { class: "num" }, gp.plain(t.step)))));
    const drawn = r.trials.filter((t) => t.curve && t.curve.x.length);
    curves.replaceChildren();
    if (gp.sweepCharts.curves) gp.sweepCharts.curves.destroy();
    gp.sweepCharts.curves = gp.chart(curves, "eval loss", "step", drawn.map((t) => ({ label: t.job, points: true })), gp.join(drawn.map((t) => t.curve)));
    gp.sweepCharts.curves.setSize({ width: Math.max(600, curves.clientWidth - 24), height: 380 });
    points.replaceChildren();
    for (const k of keys) gp.sweepCharts.scatter[k] = scatter(k, r.spec.params[k], r.trials);
    gp.sweep = r;
    gp.status("");
    gp.drawnAt = gp.drawnAt || performance.now();
    if (r.driver !== "not running" || r.trials.some((t) => gp.R.active.includes(t.job_state))) setTimeout(draw, 5000);
  }
  draw().catch((e) => { main.append(gp.el("p", { class: "error" }, e.message)); });
})();
