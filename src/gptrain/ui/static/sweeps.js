// The sweeps (`gptrain sweep list`): trials ended of all, pruned, the best trial and its eval loss.
"use strict";
(async function () {
  const main = document.getElementById("main");
  main.append(gp.el("h1", {}, "Sweeps"));
  const rows = await gp.get("/api/sweeps");
  if (!rows.length) { main.append(gp.el("p", {}, "No sweeps yet: `gptrain sweep NAME --param KEY=SPACE ... -- FLAGS`.")); gp.drawnAt = performance.now(); return; }
  main.append(gp.el("table", { id: "sweeps" },
    gp.el("thead", {}, gp.el("tr", {}, ["name", "settings", "ended", "pruned", "best", "eval loss", "driver"].map((h) => gp.el("th", {}, h)))),
    gp.el("tbody", {}, rows.map((s) => gp.el("tr", { "data-sweep": s.name },
      gp.el("td", {}, gp.el("a", { href: "/sweeps/" + encodeURIComponent(s.name) }, s.name)),
      ...(s.error ? [gp.el("td", { class: "error", colspan: 6 }, s.error)] : [
        gp.el("td", {}, s.params.join(", ")), gp.el("td", { class: "num" }, `${s.ended}/${s.trials}`),
        gp.el("td", { class: "num" }, s.pruned),
        gp.el("td", {}, s.best ? gp.el("a", { href: "/jobs/" + encodeURIComponent(s.best) }, s.best) : gp.R.missing),
        gp.el("td", { class: "num" }, gp.loss(s.best_value)), gp.el("td", {}, s.driver)]))))));
  gp.status("");
  gp.drawnAt = performance.now();
})();
