// A small line chart on <canvas>: fixed-length history, auto-scaled y axis, theme colours
// read from CSS variables at draw time. No dependencies.

/**
 * new LineChart(canvas, {series: [{color}], capacity, max, format})
 * .push([v0, v1, ...]) appends one sample per series (null = gap) and redraws.
 */
export class LineChart {
  constructor(canvas, opts) {
    this.canvas = canvas;
    this.series = opts.series;
    this.capacity = opts.capacity || 90;
    this.ceiling = opts.max ?? Infinity; // e.g. 1 for ratios: the scale grows up to it, never past
    this.format = opts.format || ((v) => String(Math.round(v)));
    this.data = this.series.map(() => []);
    this.resize = new ResizeObserver(() => this.draw());
    this.resize.observe(canvas);
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.draw());
  }

  push(values) {
    values.forEach((v, k) => {
      const arr = this.data[k];
      arr.push(v === null || v === undefined || !Number.isFinite(Number(v)) ? null : Number(v));
      if (arr.length > this.capacity) arr.shift();
    });
    const all = this.data.flat().filter((v) => v !== null);
    this.canvas.dataset.points = String(this.data[0].length);
    this.canvas.dataset.max = String(all.length ? Math.max(...all) : 0);
    this.canvas.dataset.last = String(this.data.map((a) => a[a.length - 1] ?? "").join(","));
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    const hgt = c.clientHeight;
    if (!w || !hgt) return;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(hgt * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(hgt * dpr);
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    const css = getComputedStyle(c);
    const grid = css.getPropertyValue("--border").trim() || "#ddd";
    const muted = css.getPropertyValue("--faint").trim() || "#999";
    const pad = { l: 44, r: 8, t: 8, b: 6 };
    const pw = w - pad.l - pad.r;
    const ph = hgt - pad.t - pad.b;

    const all = this.data.flat().filter((v) => v !== null);
    const top = all.length ? Math.max(...all) : 0;
    const max = top > 0 ? Math.min(this.ceiling, niceCeil(top)) : Math.min(this.ceiling, 1);

    ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    ctx.lineWidth = 1;
    for (let g = 0; g <= 2; g++) {
      const y = pad.t + ph - (ph * g) / 2;
      ctx.strokeStyle = grid;
      ctx.beginPath();
      ctx.moveTo(pad.l, Math.round(y) + 0.5);
      ctx.lineTo(w - pad.r, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillStyle = muted;
      ctx.fillText(this.format((max * g) / 2), pad.l - 6, y);
    }

    const x = (i) => pad.l + (pw * i) / Math.max(1, this.capacity - 1);
    const y = (v) => pad.t + ph - (ph * Math.min(v, max)) / max;
    this.data.forEach((arr, k) => {
      const color = resolveColor(css, this.series[k].color);
      const offset = this.capacity - arr.length;
      if (k === 0) {
        // soft fill under the first series
        ctx.beginPath();
        let open = false;
        let startX = 0;
        let lastX = 0;
        arr.forEach((v, i) => {
          if (v === null) return;
          const px = x(i + offset);
          if (!open) { ctx.moveTo(px, y(0)); startX = px; open = true; }
          ctx.lineTo(px, y(v));
          lastX = px;
        });
        if (open) {
          ctx.lineTo(lastX, y(0));
          ctx.lineTo(startX, y(0));
          ctx.globalAlpha = 0.12;
          ctx.fillStyle = color;
          ctx.fill();
          ctx.globalAlpha = 1;
        }
      }
      ctx.beginPath();
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.75;
      ctx.lineJoin = "round";
      let pen = false;
      arr.forEach((v, i) => {
        if (v === null) { pen = false; return; }
        const px = x(i + offset);
        if (pen) ctx.lineTo(px, y(v));
        else { ctx.moveTo(px, y(v)); pen = true; }
      });
      ctx.stroke();
      // a dot on the newest sample, and on samples with no neighbour to draw a line to
      ctx.fillStyle = color;
      arr.forEach((v, i) => {
        if (v === null) return;
        const lonely = (arr[i - 1] ?? null) === null && (arr[i + 1] ?? null) === null;
        if (!lonely && i !== arr.length - 1) return;
        ctx.beginPath();
        ctx.arc(x(i + offset), y(v), 2.5, 0, Math.PI * 2);
        ctx.fill();
      });
    });
  }
}

function resolveColor(css, color) {
  return color.startsWith("--") ? css.getPropertyValue(color).trim() || "#888" : color;
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
