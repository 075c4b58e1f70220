// The jobs table, kept current by the /api/jobs/stream event stream (no reloads).
"use strict";
(function () {
  const STATES = ["", ...gp.R.states];  // jobs/store.py's, through jobs/api.FACTS
  const params = new URLSearchParams(location.search);
  const main = document.getElementById("main");
  const filter = gp.el("select", { id: "state-filter" }, STATES.map((s) => gp.el("option", { value: s }, s || "all states")));
  filter.value = params.get("state") || "";
  const compare = gp.el("button", { id: "compare-selected", onclick: () => {
    const names = [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
    location.href = "/compare?jobs=" + encodeURIComponent(names.join(","));
  } }, "compare selected");
  const body = gp.el("tbody", { id: "jobs-body" });
  const launch = gp.runForm("launch", { dataset: "", engine: true, argsLabel: "trainer flags (--train.max_steps=100 ...), or a script and its arguments" },
    { url: "/api/runs", label: "launch" });
  const details = gp.el("details", { id: "new-run" }, gp.el("summary", {}, "New run…"), launch.form);
  details.addEventListener("toggle", async () => {
    if (!details.open || launch.dataset.options.length) return;
    const sets = await gp.get("/api/datasets");
    launch.dataset.replaceChildren(gp.el("option", { value: "" }, "(none: in the flags)"),
      ...sets.map((d) => gp.el("option", { value: d.name }, d.name)));
  });
  main.append(gp.el("h1", {}, "Jobs"), gp.el("div", { class: "toolbar" }, gp.el("label", {}, "show ", filter), compare), details,
    gp.el("table", { id: "jobs" }, gp.el("thead", {}, gp.el("tr", {}, ["", ...gp.R.columns.jobs].map((h) => gp.el("th", {}, h)))), body));

  let stream = null;
  function render(rows) {
    const picked = new Set([...document.querySelectorAll("input.pick:checked")].map((c) => c.value));
    body.replaceChildren(...rows.slice().reverse().map((j) => gp.el("tr", { "data-job": j.name },
      gp.el("td", {}, gp.el("input", { type: "checkbox", class: "pick", value: j.name, ...(picked.has(j.name) ? { checked: "" } : {}) })),
      gp.el("td", {}, gp.el("a", { href: "/jobs/" + encodeURIComponent(j.name) }, j.name)),
      gp.el("td", { class: "state-cell" }, gp.stateBadge(j.state)),
      gp.el("td", {}, `${gp.nodes(j)}x${j.accels} ${j.scheduler}`),
      gp.el("td", { class: "num" }, gp.steps(j.step, j.total_steps)),
      gp.el("td", { class: "num" }, gp.loss(j.loss)),
      gp.el("td", { class: "num" }, j.stalled_s != null ? "stalled " + gp.duration(j.stalled_s) : gp.duration(j.eta_s)),
      gp.el("td", { class: "num" }, gp.age(j.created)))));
    gp.jobs = rows;
    gp.drawnAt = gp.drawnAt || performance.now();
  }
  function follow() {
    if (stream) stream.close();
    const q = filter.value ? "?state=" + encodeURIComponent(filter.value) : "";
    history.replaceState(null, "", location.pathname + q);
    stream = gp.listen("/api/jobs/stream" + q, { jobs: render });
  }
  filter.addEventListener("change", follow);
  setInterval(() => gp.jobs && render(gp.jobs), 10000);  // ages move on between changes
  follow();
})();
