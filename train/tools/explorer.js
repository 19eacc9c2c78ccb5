// The attention explorer's script (train/tools/explorer.h); embedded into every page. No library, no network.
"use strict";
(function () {
  const started = performance.now();
  const errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message || e)); });
  const consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.map.call(arguments, String).join(" "));
    consoleError.apply(console, arguments);
  };

  const D = JSON.parse(document.getElementById("attograd-data").textContent);
  const app = document.getElementById("app");
  app.textContent = "";

  // ---- helpers -------------------------------------------------------------------------------------------------
  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    if (children) for (const c of children) if (c) e.appendChild(c);
    return e;
  }
  function decode(b64) {
    const s = atob(b64);
    const bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
    const view = new DataView(bytes.buffer);
    const out = new Float32Array(s.length / 4);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  function fmt(w) { return Number(w).toPrecision(6); }
  function quote(t) { return "\u2018" + t + "\u2019"; }

  // The viridis map (the SVG figures' stops), 256 entries.
  const STOPS = [[0x44, 0x01, 0x54], [0x48, 0x24, 0x75], [0x41, 0x44, 0x87], [0x35, 0x5f, 0x8d], [0x2a, 0x78, 0x8e],
    [0x21, 0x91, 0x8c], [0x22, 0xa8, 0x84], [0x44, 0xbf, 0x70], [0x7a, 0xd1, 0x51], [0xbd, 0xdf, 0x26],
    [0xfd, 0xe7, 0x25]];
  const LUT = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const v = i / 255 * 10, k = Math.min(9, Math.floor(v)), f = v - k;
    for (let c = 0; c < 3; c++) LUT[3 * i + c] = Math.round(STOPS[k][c] + f * (STOPS[k + 1][c] - STOPS[k][c]));
  }
  let gamma = 1;  // the contrast: colour = viridis(w^gamma)
  function level(w) { return w > 0 ? Math.min(1, Math.pow(Math.min(w, 1), gamma)) : 0; }

  const rows = D.rows.map(function (r) {
    return Object.assign({}, r, { W: decode(r.w), Q: D.labels[r.q], K: D.labels[r.k] });
  });
  function weight(r, h, i, j) { return r.W[(h * r.lq + i) * r.lk + j]; }

  function paint(canvas, r, h) {
    canvas.width = r.lk;
    canvas.height = r.lq;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(r.lk, r.lq);
    const base = h * r.lq * r.lk, n = r.lq * r.lk;
    for (let p = 0; p < n; p++) {
      const c = 3 * Math.round(255 * level(r.W[base + p]));
      img.data[4 * p] = LUT[c];
      img.data[4 * p + 1] = LUT[c + 1];
      img.data[4 * p + 2] = LUT[c + 2];
      img.data[4 * p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  // ---- state ---------------------------------------------------------------------------------------------------
  const state = { layer: 0, head: 0, focus: null, pinned: null, cell: null };
  const ui = {};

  if (rows.length === 0) {
    app.appendChild(el("p", { cls: "note", text: D.note || "This model has no attention layers to show." }));
  } else {
    buildModelView();
    buildHeadView();
    buildStats();
  }
  if (rows.length) selectHead(0, 0);
  const initMs = performance.now() - started;

  // ---- model view ----------------------------------------------------------------------------------------------
  function buildModelView() {
    app.appendChild(el("h2", { text: "Model view" }));
    app.appendChild(el("p", { cls: "hint", text: "One square per layer and head: its weights, queries down, keys " +
      "across (viridis, 0 dark to 1 yellow). Click a square to open the head below." }));
    let maxHeads = 0;
    for (const r of rows) maxHeads = Math.max(maxHeads, r.heads);
    const head = el("tr", null, [el("th")]);
    for (let h = 0; h < maxHeads; h++) head.appendChild(el("th", { text: "head " + h }));
    const table = el("table", { cls: "grid", id: "model-view" }, [el("thead", null, [head])]);
    const body = el("tbody");
    ui.panels = [];
    rows.forEach(function (r, l) {
      const tr = el("tr", null, [el("th", { cls: "rowlabel", text: r.label })]);
      ui.panels.push([]);
      for (let h = 0; h < r.heads; h++) {
        const c = el("canvas", { cls: "panel", "data-layer": String(l), "data-head": String(h),
          title: r.label + ", head " + h });
        paint(c, r, h);
        c.addEventListener("click", function () {
          selectHead(l, h);
          ui.headSection.scrollIntoView({ block: "start" });
        });
        ui.panels[l].push(c);
        tr.appendChild(el("td", null, [c]));
      }
      body.appendChild(tr);
    });
    table.appendChild(body);
    app.appendChild(table);
  }

  // ---- head view -----------------------------------------------------------------------------------------------
  function buildHeadView() {
    ui.headSection = el("h2", { text: "Head view", id: "head-view" });
    app.appendChild(ui.headSection);
    ui.layerSel = el("select", { id: "layer-select" });
    rows.forEach(function (r, l) { ui.layerSel.appendChild(el("option", { value: String(l), text: r.label })); });
    ui.headSel = el("select", { id: "head-select" });
    ui.contrast = el("select", { id: "contrast-select" });
    [["1", "linear"], ["0.5", "square root"], ["0.25", "fourth root"]].forEach(function (o) {
      ui.contrast.appendChild(el("option", { value: o[0], text: o[1] }));
    });
    ui.layerSel.addEventListener("change", function () { selectHead(+ui.layerSel.value, 0); });
    ui.headSel.addEventListener("change", function () { selectHead(state.layer, +ui.headSel.value); });
    ui.contrast.addEventListener("change", function () {
      gamma = +ui.contrast.value;
      rows.forEach(function (r, l) { for (let h = 0; h < r.heads; h++) paint(ui.panels[l][h], r, h); });
      paint(ui.heat, rows[state.layer], state.head);
      render();
    });
    app.appendChild(el("div", { cls: "controls" }, [
      el("label", { text: "layer " }, [ui.layerSel]), el("label", { text: "head " }, [ui.headSel]),
      el("label", { text: "contrast " }, [ui.contrast])]));
    ui.rowNote = el("p", { cls: "note", id: "row-note" });
    app.appendChild(ui.rowNote);
    app.appendChild(el("p", { cls: "hint", text: "Hover a query (left) to see what it attends to, a key (right) " +
      "to see what attends to it; click to pin, click again to release. Hover the heatmap for a cell's exact " +
      "weight." }));
    ui.readout = el("div", { id: "readout" });
    app.appendChild(ui.readout);
    ui.qcol = el("div", { cls: "col q", id: "queries" });
    ui.kcol = el("div", { cls: "col k", id: "keys" });
    ui.lines = el("canvas", { id: "lines" });
    ui.heat = el("canvas", { id: "heat" });
    app.appendChild(el("div", { cls: "headview" }, [
      el("div", { cls: "lines", id: "lines-view" }, [ui.qcol, ui.lines, ui.kcol]),
      el("div", { cls: "heat" }, [ui.heat])]));
    for (const [col, side] of [[ui.qcol, "q"], [ui.kcol, "k"]]) {
      col.addEventListener("mouseover", function (e) {
        const t = e.target.closest(".tok");
        if (!t) return;
        state.focus = { side: side, i: +t.dataset.i };
        render();
      });
      col.addEventListener("mouseout", function (e) {
        const t = e.target.closest(".tok");
        if (!t || (e.relatedTarget && t.contains(e.relatedTarget))) return;
        state.focus = null;
        render();
      });
      col.addEventListener("click", function (e) {
        const t = e.target.closest(".tok");
        if (!t) return;
        const i = +t.dataset.i;
        state.pinned = state.pinned && state.pinned.side === side && state.pinned.i === i ? null : { side: side, i: i };
        render();
      });
    }
    ui.heat.addEventListener("mousemove", function (e) {
      const r = rows[state.layer], rect = ui.heat.getBoundingClientRect();
      const j = Math.floor((e.clientX - rect.left) / rect.width * r.lk);
      const i = Math.floor((e.clientY - rect.top) / rect.height * r.lq);
      state.cell = i >= 0 && i < r.lq && j >= 0 && j < r.lk ? { i: i, j: j } : null;
      renderReadout();
    });
    ui.heat.addEventListener("mouseleave", function () { state.cell = null; renderReadout(); });
    ui.heat.addEventListener("click", function () {
      if (!state.cell) return;
      state.pinned = { side: "q", i: state.cell.i };
      render();
    });
  }

  function tokenColumn(col, labels) {
    col.textContent = "";
    const toks = [];
    labels.forEach(function (t, i) {
      const e = el("div", { cls: "tok", "data-i": String(i), title: "position " + i },
        [el("span", { cls: "t", text: t })]);
      toks.push(e);
      col.appendChild(e);
    });
    return toks;
  }

  function selectHead(l, h) {
    const r = rows[l];
    const layerChanged = l !== state.layer || !ui.qtoks;
    state.layer = l;
    state.head = Math.min(h, r.heads - 1);
    ui.layerSel.value = String(l);
    ui.headSel.textContent = "";
    for (let k = 0; k < r.heads; k++) ui.headSel.appendChild(el("option", { value: String(k), text: String(k) }));
    ui.headSel.value = String(state.head);
    ui.rowNote.textContent = r.note || "";
    ui.rowNote.style.display = r.note ? "" : "none";
    if (layerChanged) {
      ui.qtoks = tokenColumn(ui.qcol, r.Q);
      ui.ktoks = tokenColumn(ui.kcol, r.K);
      state.focus = state.pinned = null;
      const dpr = window.devicePixelRatio || 1, n = Math.max(r.lq, r.lk);
      ui.lines.style.width = "220px";
      ui.lines.style.height = 16 * n + "px";
      ui.lines.width = Math.round(220 * dpr);
      ui.lines.height = Math.round(16 * n * dpr);
      const cell = Math.max(1, Math.min(16, 512 / n));
      ui.heat.style.width = cell * r.lk + "px";
      ui.heat.style.height = cell * r.lq + "px";
    }
    for (const row of ui.panels) for (const c of row) c.classList.remove("selected");
    ui.panels[l][state.head].classList.add("selected");
    paint(ui.heat, r, state.head);
    if (ui.statRows) for (const tr of ui.statRows)
      tr.classList.toggle("selected", +tr.dataset.layer === l && +tr.dataset.head === state.head);
    render();
  }

  function render() {
    const r = rows[state.layer], h = state.head, a = state.focus || state.pinned;
    for (const t of ui.qtoks) { t.classList.remove("hl", "focus", "pinned"); t.style.background = ""; }
    for (const t of ui.ktoks) { t.classList.remove("hl", "focus", "pinned"); t.style.background = ""; }
    if (state.pinned) (state.pinned.side === "q" ? ui.qtoks : ui.ktoks)[state.pinned.i].classList.add("pinned");
    if (a) {
      (a.side === "q" ? ui.qtoks : ui.ktoks)[a.i].classList.add("focus");
      const other = a.side === "q" ? ui.ktoks : ui.qtoks;
      for (let x = 0; x < other.length; x++) {
        const w = a.side === "q" ? weight(r, h, a.i, x) : weight(r, h, x, a.i);
        if (w > 0) {
          other[x].classList.add("hl");
          other[x].style.background = "rgba(255, 127, 14, " + (0.1 + 0.9 * level(w)).toFixed(3) + ")";
          other[x].title = "weight " + fmt(w);
        } else {
          other[x].title = "position " + x;
        }
      }
    }
    drawLines(r, h, a);
    renderReadout();
  }

  function drawLines(r, h, a) {
    const c = ui.lines, ctx = c.getContext("2d"), dpr = window.devicePixelRatio || 1;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, c.width, c.height);
    const x0 = 2, x1 = 218, y = function (i) { return 16 * i + 8; };
    const buckets = 16, paths = [];
    for (let b = 0; b < buckets; b++) paths.push([]);
    const add = function (i, j, w) {
      const v = level(w);
      if (v < 0.02) return;
      paths[Math.min(buckets - 1, Math.floor(v * buckets))].push(i, j);
    };
    if (a && a.side === "q") for (let j = 0; j < r.lk; j++) add(a.i, j, weight(r, h, a.i, j));
    else if (a) for (let i = 0; i < r.lq; i++) add(i, a.i, weight(r, h, i, a.i));
    else for (let i = 0; i < r.lq; i++) for (let j = 0; j < r.lk; j++) add(i, j, weight(r, h, i, j));
    ctx.lineWidth = a ? 2 : 1;
    ctx.strokeStyle = a ? "#ff7f0e" : "#1f77b4";
    for (let b = 0; b < buckets; b++) {
      const p = paths[b];
      if (!p.length) continue;
      ctx.globalAlpha = (b + 1) / buckets * (a ? 1 : 0.8);
      ctx.beginPath();
      for (let k = 0; k < p.length; k += 2) { ctx.moveTo(x0, y(p[k])); ctx.lineTo(x1, y(p[k + 1])); }
      ctx.stroke();
    }
    ctx.globalAlpha = 1;
  }

  function renderReadout() {
    const r = rows[state.layer], h = state.head, a = state.focus || state.pinned;
    const lines = [r.label + ", head " + h + ": " + r.lq + " queries \u00d7 " + r.lk + " keys"];
    if (state.cell) {
      const c = state.cell;
      lines.push("query " + c.i + " " + quote(r.Q[c.i]) + " \u2192 key " + c.j + " " + quote(r.K[c.j]) + ": " +
        fmt(weight(r, h, c.i, c.j)));
    }
    if (a) {
      const n = a.side === "q" ? r.lk : r.lq, list = [];
      for (let x = 0; x < n; x++) {
        const w = a.side === "q" ? weight(r, h, a.i, x) : weight(r, h, x, a.i);
        if (w > 0) list.push([w, x]);
      }
      list.sort(function (u, v) { return v[0] - u[0]; });
      const top = list.slice(0, 6).map(function (e) {
        return e[1] + " " + quote(a.side === "q" ? r.K[e[1]] : r.Q[e[1]]) + " " + fmt(e[0]);
      }).join(",  ");
      lines.push(a.side === "q"
        ? "query " + a.i + " " + quote(r.Q[a.i]) + (state.pinned === a ? " (pinned)" : "") + " attends to: " + top
        : "key " + a.i + " " + quote(r.K[a.i]) + (state.pinned === a ? " (pinned)" : "") + " is attended by: " + top);
    }
    ui.readout.textContent = lines.join("\n");
  }

  // ---- statistics ----------------------------------------------------------------------------------------------
  function buildStats() {
    app.appendChild(el("h2", { text: "Heads" }));
    app.appendChild(el("p", { cls: "hint", text: "Mean over query rows: entropy of the row (nats; low = focused), " +
      "weight on position 0 (the attention sink), weight on the previous position. Click a column to sort, a row " +
      "to open the head." }));
    const cols = [["layer", "layer"], ["head", "head"], ["entropy", "mean row entropy"],
      ["sink", "sink share (position 0)"], ["previous", "previous-token share"]];
    const data = [];
    rows.forEach(function (r, l) {
      for (let h = 0; h < r.heads; h++)
        data.push({ layer: l, head: h, entropy: r.entropy[h], sink: r.sink[h], previous: r.previous[h] });
    });
    const thead = el("tr");
    const tbody = el("tbody");
    const table = el("table", { cls: "stats", id: "stats" }, [el("thead", null, [thead]), tbody]);
    let sortKey = null, asc = true;
    ui.statRows = [];
    function fill() {
      tbody.textContent = "";
      ui.statRows = [];
      for (const d of data) {
        const tr = el("tr", { "data-layer": String(d.layer), "data-head": String(d.head) }, [
          el("td", { text: rows[d.layer].label }), el("td", { text: String(d.head) }),
          el("td", { text: d.entropy.toFixed(4) }),
          el("td", null, [document.createTextNode(d.sink.toFixed(4)),
            el("span", { cls: "bar", style: "width:" + Math.round(60 * d.sink) + "px" })]),
          el("td", null, [document.createTextNode(d.previous.toFixed(4)),
            el("span", { cls: "bar", style: "width:" + Math.round(60 * d.previous) + "px" })])]);
        tr.classList.toggle("selected", d.layer === state.layer && d.head === state.head);
        tr.addEventListener("click", function () { selectHead(d.layer, d.head); });
        ui.statRows.push(tr);
        tbody.appendChild(tr);
      }
    }
    cols.forEach(function (c) {
      const th = el("th", { text: c[1], "data-key": c[0] });
      th.addEventListener("click", function () {
        asc = sortKey === c[0] ? !asc : true;
        sortKey = c[0];
        data.sort(function (u, v) {
          const d = u[sortKey] - v[sortKey] || u.layer - v.layer || u.head - v.head;
          return asc ? d : -d;
        });
        for (const t of thead.children) t.classList.remove("sorted-asc", "sorted-desc");
        th.classList.add(asc ? "sorted-asc" : "sorted-desc");
        fill();
      });
      thead.appendChild(th);
    });
    fill();
    app.appendChild(table);
  }

  // ---- self-test (#selftest): simulated hover and click, the result as JSON in <pre id="selftest"> ----------------
  function selfTest() {
    const res = { errors: errors, init_ms: Math.round(initMs), rows: rows.length,
      heads: rows.map(function (r) { return r.heads; }),
      panels: document.querySelectorAll("canvas.panel").length, checks: {} };
    const hl = function () { return document.querySelectorAll(".tok.hl").length; };
    const fire = function (node, type, extra) {
      node.dispatchEvent(new MouseEvent(type, Object.assign({ bubbles: true, cancelable: true, view: window }, extra)));
    };
    try {
      if (rows.length) {
        const last = rows.length - 1, r = rows[last];
        selectHead(last, r.heads - 1);
        res.checks.select_head = ui.layerSel.value === String(last) && ui.headSel.value === String(r.heads - 1) &&
          ui.panels[last][r.heads - 1].classList.contains("selected");
        res.query_tokens = Array.prototype.map.call(ui.qcol.querySelectorAll(".tok .t"), function (e) {
          return e.textContent;
        });
        res.key_tokens = ui.kcol.querySelectorAll(".tok").length;
        const before = hl(), readBefore = ui.readout.textContent, q = ui.qtoks[r.lq - 1];
        const t0 = performance.now();
        fire(q.firstChild, "mouseover");
        res.hover_ms = Math.round(performance.now() - t0);
        res.hover_query_highlighted = hl();
        res.checks.hover_query = before === 0 && hl() > 0 && q.classList.contains("focus") &&
          ui.readout.textContent !== readBefore && ui.readout.textContent.indexOf("attends to") >= 0;
        fire(q.firstChild, "mouseout", { relatedTarget: document.body });
        res.checks.unhover = hl() === 0;
        fire(q.firstChild, "click");
        fire(q.firstChild, "mouseout", { relatedTarget: document.body });
        res.checks.pin = hl() > 0 && q.classList.contains("pinned");
        fire(q.firstChild, "click");
        res.checks.unpin = hl() === 0;
        const k = ui.ktoks[0];
        fire(k.firstChild, "mouseover");
        res.checks.hover_key = hl() > 0 && ui.readout.textContent.indexOf("is attended by") >= 0;
        fire(k.firstChild, "mouseout", { relatedTarget: document.body });
        const rect = ui.heat.getBoundingClientRect();
        fire(ui.heat, "mousemove", { clientX: rect.left + rect.width - 1, clientY: rect.top + rect.height - 1 });
        res.checks.heat_readout = ui.readout.textContent.indexOf("query " + (r.lq - 1) + " ") >= 0 &&
          ui.readout.textContent.indexOf(fmt(weight(r, r.heads - 1, r.lq - 1, r.lk - 1))) >= 0;
        fire(ui.heat, "mouseleave");
        fire(ui.panels[0][0], "click");
        res.checks.panel_click = state.layer === 0 && state.head === 0 && ui.layerSel.value === "0";
        const th = document.querySelector("#stats th[data-key=entropy]");
        fire(th, "click");
        const ents = Array.prototype.map.call(document.querySelectorAll("#stats tbody tr td:nth-child(3)"),
          function (e) { return +e.textContent; });
        res.checks.sort = ents.every(function (v, i) { return i === 0 || ents[i - 1] <= v; }) &&
          th.classList.contains("sorted-asc");
      }
    } catch (e) {
      errors.push("self-test: " + e);
    }
    let ok = errors.length === 0;
    for (const k in res.checks) ok = ok && res.checks[k] === true;
    res.ok = ok;
    const pre = document.getElementById("selftest");
    pre.textContent = JSON.stringify(res);
    pre.hidden = false;
    document.body.setAttribute("data-selftest", ok ? "pass" : "fail");
  }
  if (location.hash === "#selftest") selfTest();
})();
