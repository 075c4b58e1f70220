// The datasets pushed with `gptrain data push`, each with a decoded sample of its tokens.
"use strict";
(async function () {
  const main = document.getElementById("main");
  main.append(gp.el("h1", {}, "Datasets"));
  const rows = await gp.get("/api/datasets");
  if (!rows.length) { main.append(gp.el("p", {}, "No datasets yet: `gptrain data push NAME DIR`.")); gp.drawnAt = performance.now(); return; }
  main.append(gp.el("table", { id: "datasets" },
    gp.el("thead", {}, gp.el("tr", {}, ["name", "kind", "tokenizer", "tokens", "size", "pushed", "sample"].map((h) => gp.el("th", {}, h)))),
    gp.el("tbody", {}, rows.map((d) => gp.el("tr", { "data-dataset": d.name },
      gp.el("td", {}, d.name), gp.el("td", {}, d.kind ?? "-"), gp.el("td", {}, d.tokenizer ?? "-"),
      gp.el("td", { class: "num" }, d.tokens === null ? "-" : d.tokens.toLocaleString()),
      gp.el("td", { class: "num" }, gp.bytes(d.bytes)), gp.el("td", {}, gp.time(d.created)),
      gp.el("td", {}, gp.el("div", { class: "sample" }, d.sample ?? `(a ${d.kind} dataset: no token sample)`)))))));
  gp.status("");
  gp.drawnAt = performance.now();
})();
