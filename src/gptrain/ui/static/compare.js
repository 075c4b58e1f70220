// Loss curves of several jobs on one chart; x = step, tokens or time (seconds since start).
"use strict";
(async function () {
  const params = new URLSearchParams(location.search);
  const main = document.getElementById("main");
  const all = await gp.get("/api/jobs");
  const chosen = new Set((params.get("jobs") || "").split(",").filter(Boolean));
  const xSel = gp.el("select", { id: "x-axis" }, ["step", "tokens", "time"].map((x) => gp.el("option", { value: x }, x)));
  xSel.value = params.get("x") || "step";
  const metricSel = gp.el("select", { id: "metric" }, [["loss", "train loss"], ["eval_loss", "eval loss"]].map(([v, t]) => gp.el("option", { value: v }, t)));
  metricSel.value = params.get("metric") || "loss";
  const picks = gp.el("div", { id: "picks" }, all.slice().reverse().map((j) => gp.el("label", {},
    gp.el("input", { type: "checkbox", value: j.name, ...(chosen.has(j.name) ? { checked: "" } : {}) }), ` ${j.name} `)));
  const area = gp.el("div", { class: "charts", id: "compare-area" });
  main.append(gp.el("h1", {}, "Compare"), gp.el("div", { class: "toolbar" }, gp.el("label", {}, "x ", xSel), gp.el("label", {}, "curve ", metricSel)), picks, area);

  async function draw() {
    const names = [...picks.querySelectorAll("input:checked")].map((c) => c.value);
    history.replaceState(null, "", `/compare?jobs=${encodeURIComponent(names.join(","))}&x=${xSel.value}&metric=${metricSel.value}`);
    const curves = await Promise.all(names.map((n) => gp.get(`/api/jobs/${encodeURIComponent(n)}/curves?x=${xSel.value}&max=2000`)));
    area.replaceChildren();
    if (!names.length) { area.append(gp.el("p", {}, "Pick jobs above.")); return; }
    const series = curves.map((c) => c[metricSel.value]);
    gp.compareChart = gp.chart(area, metricSel.selectedOptions[0].text, xSel.value, names.map((n) => ({ label: n })), gp.join(series));
    gp.compareChart.root.parentElement.style.width = "auto";
    gp.compareChart.setSize({ width: Math.max(600, area.clientWidth - 24), height: 420 });
    gp.drawnAt = gp.drawnAt || performance.now();
    gp.status("");
  }
  for (const c of [xSel, metricSel, picks]) c.addEventListener("change", draw);
  draw();
})();
