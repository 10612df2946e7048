// memzoo inspect: renders the inlined data (see page.rs for its encoding). No network.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("memzoo-data").textContent);
  const LN2 = Math.LN2;
  const CHUNK = 2000;
  const n = D.pieces.length;

  function bytes(b64) {
    const s = atob(b64 || "");
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  function u16(b64) {
    const b = bytes(b64);
    return new Uint16Array(b.buffer, 0, b.length >> 1);
  }
  function u32(b64) {
    const b = bytes(b64);
    return new Uint32Array(b.buffer, 0, b.length >> 2);
  }
  // Losses in bits of token i (i >= 1); index i - 1.
  const lw = u16(D.lw), lo = u16(D.lo);
  const bitsWith = (i) => lw[i - 1] / 1000 / LN2;
  const bitsWithout = (i) => lo[i - 1] / 1000 / LN2;
  const layers = D.layers.map((l) => ({
    index: l.index, kind: l.kind, heads: l.heads, knn: l.knn, cm: !!l.cm, k: l.k || 0, rounds: l.rounds || 0,
    mass: l.mass ? bytes(l.mass) : null,
    np: l.np ? u32(l.np) : null, nw: l.nw ? bytes(l.nw) : null,
    ns: l.ns ? new Int8Array(bytes(l.ns).buffer) : null,
    bk: l.bk ? u16(l.bk) : null,
  }));

  const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const show = (s) => s.replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5").replace(/ /g, "\u00b7");
  const fmt = (x, d) => x.toFixed(d === undefined ? 2 : d);

  // ---- header
  document.getElementById("title").textContent = "memzoo inspect: " + D.model;
  const truncated = D.bytes_read < D.bytes_total
    ? ` (the first ${D.bytes_read.toLocaleString()} of ${D.bytes_total.toLocaleString()} bytes)` : "";
  document.getElementById("meta").textContent =
    `${D.text}${truncated} · ${n.toLocaleString()} tokens · ${D.family}, ` +
    `${layers.length} layers (${layers.map((l) => l.kind).join(", ")}) · segments of ${D.tgt_len}, memory ${D.mem_len}`;
  const S = D.summary;
  document.getElementById("stats").innerHTML =
    `<div class="stat"><b>${fmt(S.bpc_with, 3)}</b><span>bits/token with memory</span></div>` +
    `<div class="stat"><b>${fmt(S.bpc_without, 3)}</b><span>without memory (same weights, fresh state per segment)</span></div>` +
    `<div class="stat"><b>${fmt(S.bpc_without - S.bpc_with, 3)}</b><span>gained per token over ${S.tokens.toLocaleString()} tokens</span></div>`;

  function snippet(start, len, mark) {
    let s = "";
    const a = Math.max(0, start), b = Math.min(n, start + len);
    for (let i = a; i < b; i++) {
      const p = esc(D.pieces[i]);
      s += i === mark ? "<mark>" + p + "</mark>" : p;
    }
    return s;
  }
  const regions = document.getElementById("regions");
  S.regions.forEach((r) => {
    const li = document.createElement("li");
    li.innerHTML = `${fmt(r.gain / LN2, 1)} bits, tokens ${r.start}\u2013${r.start + r.len - 1}: ` +
      `<code>${esc(show(D.pieces.slice(r.start, r.start + Math.min(r.len, 40)).join("")))}</code>`;
    li.onclick = () => jump(r.start, r.len);
    regions.appendChild(li);
  });
  const tops = document.getElementById("tops");
  S.tokens_top.forEach((i) => {
    const li = document.createElement("li");
    li.innerHTML = `<code>${esc(show(D.pieces[i] || ""))}</code> at ${i}: ${fmt(bitsWithout(i))} \u2192 ${fmt(bitsWith(i))} bits ` +
      `<span class="muted">${esc(show(D.pieces.slice(Math.max(0, i - 24), i).join("")))}</span>`;
    li.onclick = () => jump(i, 1);
    tops.appendChild(li);
  });

  // ---- colours: 21 bins per mode, the container's class picks the mode.
  const BINS = 10;
  function gainBin(i) {
    if (i === 0) return "n";
    const g = bitsWithout(i) - bitsWith(i); // bits; +: memory helped
    const b = Math.round(Math.max(-1, Math.min(1, g / 4)) * BINS);
    return "g" + (b + BINS);
  }
  function lossBin(bits) {
    return Math.round(Math.max(0, Math.min(1, bits / 8)) * 2 * BINS);
  }
  (function styles() {
    let css = "";
    const mix = (a, b, t) => a.map((x, j) => Math.round(x + (b[j] - x) * t));
    const white = [255, 255, 255], blue = [33, 102, 172], red = [202, 52, 40], orange = [230, 85, 13];
    for (let b = 0; b <= 2 * BINS; b++) {
      const t = (b - BINS) / BINS;
      const g = t >= 0 ? mix(white, blue, t) : mix(white, red, -t);
      css += `.mode-gain .g${b}{background:rgb(${g})}`;
      const l = mix(white, orange, b / (2 * BINS));
      css += `.mode-with .w${b},.mode-without .o${b}{background:rgb(${l})}`;
      if (t > 0.55) css += `.mode-gain .g${b}{color:#fff}`;
      if (b > 1.4 * BINS) css += `.mode-with .w${b},.mode-without .o${b}{color:#fff}`;
    }
    const st = document.createElement("style");
    st.textContent = css;
    document.head.appendChild(st);
    const legend = document.getElementById("legend");
    legend.innerHTML = `<span>memory hurt</span><i style="background:rgb(${red})"></i><i style="background:#fff;border:1px solid #ccc"></i>` +
      `<i style="background:rgb(${blue})"></i><span>helped (\u00b14 bits)</span>`;
  })();

  // ---- tokens, rendered a chunk at a time (the first at once, the rest between frames).
  const text = document.getElementById("text");
  const chunks = [];
  for (let c = 0; c * CHUNK < n; c++) {
    const div = document.createElement("div");
    div.className = "chunk";
    div.dataset.c = c;
    text.appendChild(div);
    chunks.push({ div, done: false });
  }
  function renderChunk(c) {
    const ch = chunks[c];
    if (!ch || ch.done) return;
    const a = c * CHUNK, b = Math.min(n, a + CHUNK);
    const frag = document.createDocumentFragment();
    for (let i = a; i < b; i++) {
      const s = document.createElement("span");
      const cls = i === 0 ? "t n" : `t ${gainBin(i)} w${lossBin(bitsWith(i))} o${lossBin(bitsWithout(i))}`;
      s.className = cls;
      s.textContent = D.pieces[i];
      frag.appendChild(s);
    }
    ch.div.appendChild(frag);
    ch.done = true;
  }
  function tokenSpan(i) {
    renderChunk(Math.floor(i / CHUNK));
    const ch = chunks[Math.floor(i / CHUNK)];
    return ch ? ch.div.children[i % CHUNK] : null;
  }
  renderChunk(0);
  let next = 1;
  (function more() {
    const t0 = performance.now();
    while (next < chunks.length && performance.now() - t0 < 12) renderChunk(next++);
    if (next < chunks.length) setTimeout(more, 0);
    else {
      document.body.dataset.rendered = "all";
      document.body.dataset.renderedMs = Math.round(performance.now());
    }
  })();

  document.querySelectorAll(".controls button").forEach((btn) => {
    btn.onclick = () => {
      document.querySelectorAll(".controls button").forEach((b) => b.classList.remove("on"));
      btn.classList.add("on");
      text.className = "mode-" + btn.dataset.mode;
    };
  });

  // ---- the side panel
  const panel = document.getElementById("panel");
  let pinned = -1, marked = [];
  function indexOf(el) {
    if (!el || !el.classList || !el.classList.contains("t")) return -1;
    const c = +el.parentNode.dataset.c;
    return c * CHUNK + Array.prototype.indexOf.call(el.parentNode.children, el);
  }
  function unmark(cls) {
    marked = marked.filter((m) => {
      if (m[1] === cls) { m[0].classList.remove(cls); return false; }
      return true;
    });
  }
  function mark(i, cls) {
    const s = tokenSpan(i);
    if (s) { s.classList.add(cls); marked.push([s, cls]); }
    return s;
  }
  function jump(i, len) {
    unmark("hl");
    for (let j = i; j < Math.min(n, i + len); j++) mark(j, "hl");
    const s = tokenSpan(i);
    if (s) s.scrollIntoView({ block: "center" });
    select(i, true);
  }
  window.memzooJump = jump;

  // A layer's parts, in the order of its packed masses; the segment takes the rest.
  const MEMORY = D.memory || "XL memory";
  const parts = (l) => [
    ...(l.cm ? [["c", "compressed memory"]] : []), ["m", MEMORY], ...(l.knn ? [["k", "kNN"]] : []),
  ];
  // The masses of query t, head hd: one per part, then the segment's.
  function masses(l, t, hd) {
    const n = parts(l).length, at = (t * l.heads + hd) * n;
    const v = Array.from({ length: n }, (_, i) => l.mass[at + i] / 255);
    return [...v, Math.max(0, 1 - v.reduce((a, b) => a + b, 0))];
  }
  function bar(l, v) {
    const pct = (x) => (100 * x).toFixed(1);
    const ps = [...parts(l), ["s", "segment"]];
    return `<div class="bar" title="${ps.map(([, name], i) => `${name} ${pct(v[i])}%`).join(" · ")}">` +
      ps.map(([c], i) => `<i class="${c}" style="width:${pct(v[i])}%"></i>`).join("") + `</div>`;
  }
  function layerHtml(l, t) {
    let h = `<h3>layer ${l.index}: ${l.kind}</h3>`;
    if (l.mass) {
      h += `<table class="mass"><tr><th>head</th>${parts(l).map(([, name]) => `<th>${name}</th>`).join("")}<th>segment</th><th></th></tr>`;
      for (let hd = 0; hd < l.heads; hd++) {
        const v = masses(l, t, hd);
        h += `<tr><td>${hd}</td>${v.map((x) => `<td>${fmt(x)}</td>`).join("")}<td style="width:45%">${bar(l, v)}</td></tr>`;
      }
      h += "</table>";
    } else if (!l.bk) {
      h += `<div class="muted">no probe for this kind of layer</div>`;
    }
    if (l.knn && l.np) {
      h += `<div class="muted">retrieved neighbours (heaviest ${l.k} per head): position, weight in the layer's output, cosine</div><ul class="nbs">`;
      for (let hd = 0; hd < l.heads; hd++) {
        for (let j = 0; j < l.k; j++) {
          const at = (t * l.heads + hd) * l.k + j;
          const pos = l.np[at] - 1, w = l.nw[at] / 255, cs = l.ns[at] / 127;
          if (l.nw[at] === 0 && pos < 0) continue;
          const where = pos >= 0 ? `#${pos}` : "(unknown)";
          h += `<li data-pos="${pos}"><span class="head">h${hd}</span> ${where} · w ${fmt(w)} · cos ${fmt(cs)}` +
            (pos >= 0 ? `<div class="ctx">${snippet(pos - 30, 46, pos)}</div>` : "") + "</li>";
        }
      }
      h += "</ul>";
    }
    if (l.bk) {
      h += `<div class="muted">LSH buckets (per head: one per round)</div><div class="ctx">`;
      for (let hd = 0; hd < l.heads; hd++) {
        const b = [];
        for (let r = 0; r < l.rounds; r++) b.push(l.bk[(t * l.heads + hd) * l.rounds + r]);
        h += `h${hd}: ${b.join(", ")}\n`;
      }
      h += "</div>";
    }
    return h;
  }
  function select(i, pin) {
    if (pinned >= 0 && !pin) return;
    unmark("sel");
    unmark("nb");
    if (pin) pinned = i;
    mark(i, "sel");
    let h = `<h2>token ${i} <span class="tok">${esc(show(D.pieces[i]))}</span></h2>`;
    h += `<div class="ctx">${snippet(i - 60, 80, i)}</div>`;
    if (i === 0) {
      h += `<p class="muted">The first token: nothing predicts it.</p>`;
    } else {
      const w = bitsWith(i), o = bitsWithout(i);
      h += `<p>loss <b>${fmt(w)}</b> bits with memory, <b>${fmt(o)}</b> without: ` +
        `memory ${o >= w ? "saved" : "cost"} <b>${fmt(Math.abs(o - w))}</b> bits.</p>`;
      h += `<p class="muted">Attention of the query that predicted it (at token ${i - 1}):` +
        `<span class="key">${layers.some((l) => l.cm) ? `<i class="c"></i>compressed memory` : ""}<i class="m"></i>${MEMORY}` +
        `${layers.some((l) => l.knn) ? `<i class="k"></i>kNN` : ""}<i class="s"></i>segment</span></p>`;
      layers.forEach((l) => { h += layerHtml(l, i - 1); });
    }
    h += pin ? `<p class="muted">Pinned: click the token again (or Esc) to follow the mouse.</p>` : "";
    panel.innerHTML = h;
    panel.querySelectorAll("li[data-pos]").forEach((li) => {
      const p = +li.dataset.pos;
      if (p >= 0) {
        mark(p, "nb");
        li.onclick = () => jump(p, 1);
      }
    });
  }
  text.addEventListener("mouseover", (e) => {
    const i = indexOf(e.target);
    if (i >= 0) select(i, false);
  });
  text.addEventListener("click", (e) => {
    const i = indexOf(e.target);
    if (i < 0) return;
    if (pinned === i) { pinned = -1; select(i, false); } else { pinned = -1; select(i, true); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") pinned = -1; });

  // ---- overview: mean masses per layer over the text
  (function overview() {
    let h = `<h3>Mean attention per layer over the text</h3><table class="overview">`;
    layers.forEach((l) => {
      if (!l.mass) return;
      const n = parts(l).length, sum = new Array(n).fill(0);
      let cnt = 0;
      for (let at = 0; at < l.mass.length; at += n) {
        for (let i = 0; i < n; i++) sum[i] += l.mass[at + i];
        cnt++;
      }
      const v = sum.map((x) => x / (255 * Math.max(cnt, 1)));
      v.push(Math.max(0, 1 - v.reduce((a, b) => a + b, 0)));
      h += `<tr><td>layer ${l.index} (${l.kind})</td><td style="width:60%">${bar(l, v)}</td>` +
        `<td>${v.map((x) => fmt(x)).join(" / ")}</td></tr>`;
    });
    const names = [...new Set(layers.flatMap((l) => parts(l).map(([, name]) => name)))];
    h += `</table><p class="muted">${[...names, "segment"].join(" / ")}</p>`;
    document.getElementById("overview").innerHTML = h;
  })();

  const fit = () => document.documentElement.style.setProperty("--head", document.getElementById("head").offsetHeight + "px");
  fit();
  window.addEventListener("resize", fit);
  // `page.html#t=123` opens with token 123 selected.
  const m = /^#t=(\d+)$/.exec(location.hash);
  if (m && +m[1] < n) jump(+m[1], 1);
  document.body.dataset.ready = "yes";
  document.body.dataset.readyMs = Math.round(performance.now());
})();
