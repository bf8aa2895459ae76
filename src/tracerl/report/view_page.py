"""The viewer page's CSS and JavaScript (`tracerl.report.view` inlines them into one HTML file).

The script reads the step data from `<script type="application/json" id="tracerl-data">`, draws every tree as a
compact SVG outline (one path for the edges of a tree, one shape per node), and builds the turn text of a node
only when it is clicked. Model text only ever reaches the page through `textContent`, never `innerHTML`. After the
first render it sets `document.body.dataset.rendered = "1"`, `dataset.renderMs` (script start to render done) and
`dataset.renderedAt` (navigation start to render done, both from `performance.now()`), which the browser tests
and `tracerl bench view` wait for; `dataset.paintedAt` follows in the next frame (layout and paint done).

Deliberately not here: any framework, any network request, any data processing beyond layout (backed-up success,
outcome classes and counts arrive precomputed from Python).
"""

CSS = """
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; background: #f6f6f4; }
header.top { position: sticky; top: 0; z-index: 3; background: #fff; border-bottom: 1px solid #ddd; padding: 8px 14px; }
header.top h1 { font-size: 15px; margin: 0 0 4px 0; }
.summary { color: #444; margin-bottom: 6px; }
.controls { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; }
.controls label { display: flex; gap: 4px; align-items: center; }
.legend { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; color: #555; margin-top: 6px; }
.ramp { width: 120px; height: 10px; border: 1px solid #999;
  background: linear-gradient(90deg, hsl(0,65%,45%), hsl(60,65%,45%), hsl(120,65%,45%)); }
.swatch { display: inline-block; width: 10px; height: 10px; border: 2px solid; border-radius: 50%; vertical-align: middle; }
main { display: flex; align-items: flex-start; gap: 12px; padding: 10px 14px; }
#left { flex: 1 1 60%; min-width: 0; }
#panel { flex: 0 0 38%; position: sticky; top: 110px; max-height: calc(100vh - 120px); overflow: auto;
  background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px; }
#panel .hint { color: #777; }
#trees { display: flex; flex-wrap: wrap; gap: 8px; }
.tree { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 4px 6px;
  content-visibility: auto; contain-intrinsic-size: auto 240px auto 140px; }
.tree .head { display: flex; flex-wrap: wrap; gap: 6px; font-size: 12px; margin-bottom: 2px; }
.tree .pid { font-weight: 600; max-width: 200px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.badge { padding: 0 5px; border-radius: 8px; background: #eee; color: #333; }
.badge.mixed { background: #fde68a; } .badge.success { background: #bbf7d0; } .badge.fail { background: #fecaca; }
svg .node { cursor: pointer; stroke: #333; stroke-width: 0.6; }
svg .node.root { stroke: #000; stroke-width: 1.4; }
svg .node.expanded { stroke-width: 2.2; }
svg .node.sel { stroke: #000; stroke-width: 3; }
svg .edges { fill: none; stroke: #888; stroke-width: 1; }
svg .edges.cont { stroke-dasharray: 3 2; stroke: #555; }
svg text { font-size: 8px; fill: #222; pointer-events: none; paint-order: stroke; stroke: #fff; stroke-width: 2px; }
#pool table, #panel table { border-collapse: collapse; }
#pool td, #pool th { padding: 1px 8px; border-bottom: 1px solid #eee; text-align: left; }
#pool { margin-top: 12px; background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; }
#panel dl { display: grid; grid-template-columns: max-content 1fr; gap: 1px 10px; margin: 6px 0; }
#panel dt { color: #666; } #panel dd { margin: 0; }
.turn { border-left: 3px solid #ddd; padding: 2px 8px; margin: 8px 0; }
.turn.current { border-left-color: #1f5fbf; background: #f0f5ff; }
.turn h4 { margin: 0 0 2px 0; font-size: 12px; }
.turn .label { font-size: 11px; color: #666; margin-top: 4px; }
.turn pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; padding: 4px 6px; max-height: 320px; overflow: auto;
  font: 12px/1.35 ui-monospace, SFMono-Regular, Menlo, monospace; border-radius: 4px; }
.turn pre.policy { background: #eef6ee; } .turn pre.observation { background: #f3f0e8; } .turn pre.prompt { background: #eef0f6; }
#tip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 2px 6px; border-radius: 4px;
  font-size: 11px; display: none; z-index: 5; }
.empty { color: #777; font-style: italic; }
"""

JS = r"""
(function () {
  "use strict";
  var scriptStart = performance.now();
  var DATA = JSON.parse(document.getElementById("tracerl-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  var DX = 24, DY = 11, PAD = 7, R = 3.6, LABEL = 54;
  var REASON = {predictor: "#1f5fbf", uniform: "#8a3ffc", random: "#d97706"};
  var state = {step: DATA.initial, outcome: "all", domain: "all", method: "all", cards: [], sel: null};

  function h(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) { for (var k in attrs) { e.setAttribute(k, attrs[k]); } }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function sv(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    return e;
  }
  function fmt(x, digits) { return (x === null || x === undefined) ? "\u2013" : Number(x).toFixed(digits === undefined ? 2 : digits); }
  function colour(v) { return (v === null || v === undefined) ? "#bbb" : "hsl(" + Math.round(120 * v) + ",65%,45%)"; }
  function reasonColour(r) { return REASON[r] || "#444"; }
  function clear(e) { while (e.firstChild) { e.removeChild(e.firstChild); } }
  function step() { return DATA.steps[state.step]; }

  // Tidy layout: leaves take consecutive rows in pre-order, an inner node sits between its first and last child.
  function layout(nodes) {
    var n = nodes.length, kids = [], y = new Float64Array(n), order = [], stack = [0], row = 0, maxDepth = 0, i, j;
    for (i = 0; i < n; i++) { kids.push([]); }
    for (i = 1; i < n; i++) { kids[nodes[i].pa].push(i); }
    while (stack.length) {
      i = stack.pop(); order.push(i);
      for (j = kids[i].length - 1; j >= 0; j--) { stack.push(kids[i][j]); }
    }
    for (j = 0; j < order.length; j++) {
      i = order[j];
      if (!kids[i].length) { y[i] = row++; }
      if (nodes[i].d > maxDepth) { maxDepth = nodes[i].d; }
    }
    for (j = order.length - 1; j >= 0; j--) {
      i = order[j];
      if (kids[i].length) { y[i] = (y[kids[i][0]] + y[kids[i][kids[i].length - 1]]) / 2; }
    }
    return {y: y, rows: Math.max(row, 1), maxDepth: maxDepth};
  }

  function badge(text, cls) { return h("span", {"class": "badge" + (cls ? " " + cls : "")}, text); }

  function treeCard(s, t, ti) {
    var card = h("section", {"class": "tree", "data-tree": String(ti), "data-outcome": t.outcome,
                             "data-domain": t.domain, "data-method": s.method});
    var head = h("div", {"class": "head"});
    var pid = h("span", {"class": "pid"}, t.prompt_id); pid.title = t.prompt_id;
    head.appendChild(pid);
    head.appendChild(badge(t.outcome === "success" ? "all success" : t.outcome === "fail" ? "all fail" : t.outcome, t.outcome));
    head.appendChild(badge("p " + fmt(t.nodes[0].p)));
    head.appendChild(badge("m " + t.nodes[0].k));
    head.appendChild(badge(t.num_success + "/" + t.num_leaves + " ok"));
    head.appendChild(badge(t.nodes.length + " nodes"));
    if (t.num_anchors) { head.appendChild(badge("stage 2: " + t.num_anchors + " anchors, +" + t.num_continuations)); }
    card.appendChild(head);

    var L = layout(t.nodes), nodes = t.nodes;
    var width = PAD * 2 + L.maxDepth * DX + LABEL, height = PAD * 2 + (L.rows - 1) * DY;
    var svg = sv("svg", {width: width, height: height, viewBox: "0 0 " + width + " " + height});
    var bare = [], cont = [], i, x, y, px, py, nd;
    for (i = 1; i < nodes.length; i++) {
      nd = nodes[i];
      x = PAD + nd.d * DX; y = PAD + L.y[i] * DY; px = PAD + nodes[nd.pa].d * DX; py = PAD + L.y[nd.pa] * DY;
      (nd.o === "continuation" ? cont : bare).push("M" + px + "," + py + "V" + y + "H" + x);
    }
    if (bare.length) { svg.appendChild(sv("path", {"class": "edges", d: bare.join("")})); }
    if (cont.length) { svg.appendChild(sv("path", {"class": "edges cont", d: cont.join("")})); }
    for (i = 0; i < nodes.length; i++) {
      nd = nodes[i];
      x = PAD + nd.d * DX; y = PAD + L.y[i] * DY;
      var cls = "node" + (i === 0 ? " root" : "") + (i > 0 && nd.k > 0 ? " expanded" : "") + (nd.r !== null ? " leaf" : "");
      var shape = nd.r !== null
        ? sv("rect", {x: x - R, y: y - R, width: 2 * R, height: 2 * R, fill: colour(nd.v), "class": cls, "data-i": i})
        : sv("circle", {cx: x, cy: y, r: (i > 0 && nd.k > 0) ? R + 1 : R, fill: colour(nd.v), "class": cls, "data-i": i});
      if (i > 0 && nd.k > 0) { shape.setAttribute("stroke", reasonColour(nd.x)); }
      svg.appendChild(shape);
      if (i > 0 && nd.k > 0) {
        var label = sv("text", {x: x + R + 2, y: y - R - 1});
        label.textContent = "+" + nd.k + (nd.p !== null ? " p" + fmt(nd.p) : "");
        svg.appendChild(label);
      }
    }
    card.appendChild(svg);
    return card;
  }

  function summaryText(s) {
    return "step " + s.step + " \u00b7 method " + s.method + " \u00b7 domain " + s.domain + " \u00b7 pool " + s.pool.length +
      " prompts, " + s.num_granted_prompts + " granted, " + s.num_filtered + " filtered out \u00b7 " + s.trees.length +
      " trees, " + s.num_nodes + " nodes, " + s.num_mixed + " mixed \u00b7 stage 2: " + s.num_anchors + " anchors, " +
      s.num_continuations + " continuations" + (s.has_p ? "" : " \u00b7 no predictor (p not available)");
  }

  function renderPool(s) {
    var box = document.getElementById("pool"); clear(box);
    var out = s.pool.filter(function (q) { return q.granted === 0; });
    out.sort(function (a, b) { return (a.p === null ? 2 : a.p) - (b.p === null ? 2 : b.p); });
    var det = h("details", {open: ""});
    det.appendChild(h("summary", null, "Filtered out by stage 1 (granted 0): " + out.length + " of " + s.pool.length +
      " pool prompts" + (s.has_p ? "" : " (this method has no predictor: p not available)")));
    if (!out.length) { det.appendChild(h("p", {"class": "empty"}, "none: every pool prompt got rollouts")); }
    else {
      var table = h("table", {id: "filtered"}), tr = h("tr");
      tr.appendChild(h("th", null, "prompt")); tr.appendChild(h("th", null, "predicted p")); table.appendChild(tr);
      out.forEach(function (q) {
        var row = h("tr", {"class": "filtered"});
        row.appendChild(h("td", null, q.prompt_id)); row.appendChild(h("td", null, fmt(q.p, 3)));
        table.appendChild(row);
      });
      det.appendChild(table);
    }
    box.appendChild(det);
  }

  function fillSelect(id, values, current) {
    var sel = document.getElementById(id); clear(sel);
    values.forEach(function (v) { var o = h("option", {value: v[0]}, v[1]); if (v[0] === current) { o.selected = true; } sel.appendChild(o); });
  }

  function applyFilters() {
    var shown = 0;
    state.cards.forEach(function (c) {
      var ok = (state.outcome === "all" || c.dataset.outcome === state.outcome) &&
               (state.domain === "all" || c.dataset.domain === state.domain) &&
               (state.method === "all" || c.dataset.method === state.method);
      c.style.display = ok ? "" : "none";
      if (ok) { shown++; }
    });
    document.getElementById("shown").textContent = "showing " + shown + " of " + state.cards.length + " trees";
  }

  function render() {
    var s = step(), list = document.getElementById("trees"), frag = document.createDocumentFragment();
    document.getElementById("summary").textContent = summaryText(s);
    clear(list); state.cards = []; state.sel = null;
    s.trees.forEach(function (t, ti) { var c = treeCard(s, t, ti); state.cards.push(c); frag.appendChild(c); });
    if (!s.trees.length) { list.appendChild(h("p", {"class": "empty"}, "no trees in this step: stage 1 granted nothing")); }
    list.appendChild(frag);
    var domains = {}; s.trees.forEach(function (t) { domains[t.domain] = 1; });
    fillSelect("f-domain", [["all", "all"]].concat(Object.keys(domains).sort().map(function (d) { return [d, d]; })), state.domain);
    var methods = {}; DATA.steps.forEach(function (x) { methods[x.method] = 1; });
    fillSelect("f-method", [["all", "all"]].concat(Object.keys(methods).sort().map(function (m) { return [m, m]; })), state.method);
    state.domain = document.getElementById("f-domain").value; state.method = document.getElementById("f-method").value;
    renderPool(s); applyFilters();
    var panel = document.getElementById("panel"); clear(panel);
    panel.appendChild(h("p", {"class": "hint"}, "Click a node to read its turns (policy text and observation)."));
    var now = performance.now();
    document.body.dataset.renderMs = (now - scriptStart).toFixed(1);
    document.body.dataset.renderedAt = now.toFixed(1);
    document.body.dataset.rendered = "1";
    // the frame after the DOM is built: layout and paint of the first render are done by then
    requestAnimationFrame(function () { setTimeout(function () { document.body.dataset.paintedAt = performance.now().toFixed(1); }, 0); });
  }

  function fact(dl, name, value) { dl.appendChild(h("dt", null, name)); dl.appendChild(h("dd", null, value)); }

  function showNode(ti, i) {
    var s = step(), t = s.trees[ti], nd = t.nodes[i], panel = document.getElementById("panel");
    clear(panel);
    if (state.sel) { state.sel.classList.remove("sel"); }
    state.sel = state.cards[ti].querySelector('[data-i="' + i + '"]');
    if (state.sel) { state.sel.classList.add("sel"); }
    panel.appendChild(h("h3", null, t.prompt_id + " \u00b7 node " + i));
    var dl = h("dl");
    fact(dl, "depth", nd.d); fact(dl, "origin", nd.o); fact(dl, "anchor", nd.a);
    fact(dl, "backed-up success", fmt(nd.v, 3) + " over " + nd.n + " leaves" + (nd.m ? " (mixed)" : ""));
    if (nd.r !== null) { fact(dl, "reward", nd.r); fact(dl, "finish", nd.f); }
    fact(dl, "tool error", nd.e ? "yes" : "no");
    fact(dl, "predicted p", fmt(nd.p, 3));
    fact(dl, "expanded", nd.k > 0 ? (nd.x || "?") + ", " + nd.k + (i === 0 ? " rollouts" : " continuations") : "no");
    fact(dl, "tokens", nd.tp + " policy + " + nd.to + " observation");
    panel.appendChild(dl);
    var path = [], j = i;
    while (j !== null && j !== undefined) { path.push(j); j = t.nodes[j].pa; }
    path.reverse();
    var current = null;
    path.forEach(function (k) {
      var n = t.nodes[k], box = h("div", {"class": "turn" + (k === i ? " current" : ""), "data-node": String(k)});
      if (k === 0) {
        box.appendChild(h("h4", null, "prompt (node 0)"));
        box.appendChild(h("pre", {"class": "prompt"}, n.ot));
      } else {
        box.appendChild(h("h4", null, "turn " + n.d + " (node " + k + ", " + n.o + (n.r !== null ? ", reward " + n.r : "") + ")"));
        box.appendChild(h("div", {"class": "label"}, "policy text"));
        box.appendChild(h("pre", {"class": "policy"}, n.pt));
        box.appendChild(h("div", {"class": "label"}, "observation"));
        box.appendChild(n.ot ? h("pre", {"class": "observation"}, n.ot) : h("div", {"class": "empty"}, "(none)"));
      }
      if (k === i) { current = box; }
      panel.appendChild(box);
    });
    if (current) { current.scrollIntoView({block: "nearest"}); }
  }

  function tip(ev) {
    var box = document.getElementById("tip"), target = ev.target.closest ? ev.target.closest(".node") : null;
    if (!target) { box.style.display = "none"; return; }
    var t = step().trees[Number(target.closest(".tree").dataset.tree)], i = Number(target.dataset.i), nd = t.nodes[i];
    box.textContent = "node " + i + " \u00b7 depth " + nd.d + " \u00b7 v\u0302 " + fmt(nd.v) + " (" + nd.n + " leaves)" +
      (nd.p !== null ? " \u00b7 p " + fmt(nd.p) : "") + (nd.k ? " \u00b7 +" + nd.k : "") + (nd.r !== null ? " \u00b7 r " + nd.r : "");
    box.style.left = (ev.clientX + 12) + "px"; box.style.top = (ev.clientY + 12) + "px"; box.style.display = "block";
  }

  function init() {
    fillSelect("f-step", DATA.steps.map(function (s, k) { return [String(k), "step " + s.step]; }), String(state.step));
    document.getElementById("f-step").disabled = DATA.steps.length < 2;
    document.getElementById("f-step").addEventListener("change", function (e) { state.step = Number(e.target.value); render(); });
    ["outcome", "domain", "method"].forEach(function (name) {
      document.getElementById("f-" + name).addEventListener("change", function (e) { state[name] = e.target.value; applyFilters(); });
    });
    var list = document.getElementById("trees");
    list.addEventListener("click", function (ev) {
      var target = ev.target.closest ? ev.target.closest(".node") : null;
      if (target) { showNode(Number(target.closest(".tree").dataset.tree), Number(target.dataset.i)); }
    });
    list.addEventListener("mouseover", tip);
    list.addEventListener("mouseleave", function () { document.getElementById("tip").style.display = "none"; });
    render();
  }
  init();
})();
"""
