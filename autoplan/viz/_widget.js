// A plotly figure as a light widget: the figure lives in the model's `figure` trait (the whole
// truth: a reloaded page, a second view or a reopened notebook draws from it), plotly.js is
// loaded once per page (reused when the page has it, else sent by the kernel as one binary
// message and evaluated once), clicks go back to the kernel as custom messages.

const KEY = "__autoplan_plotly__";

function pageState() {
  const g = globalThis;
  if (!g[KEY]) {
    g[KEY] = { promise: null, resolve: null, reject: null, requested: false };
  }
  return g[KEY];
}

function pagePlotly() {
  const P = globalThis.Plotly;
  return P && typeof P.react === "function" ? P : null;
}

async function evaluate(buffer) {
  const code = new TextDecoder().decode(buffer);
  // as a module: `module` keeps the bundle from writing globals other than window.Plotly
  const src = "const module = { exports: {} };\n" + code + "\nexport default module.exports;";
  pageState().evaluated = (pageState().evaluated || 0) + 1;
  const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
  try {
    const mod = await import(/* webpackIgnore: true */ url);
    return pagePlotly() || mod.default;
  } finally {
    URL.revokeObjectURL(url);
  }
}

function waitForPlotly() {
  const st = pageState();
  const have = pagePlotly();
  if (have) return Promise.resolve(have);
  if (!st.promise) {
    st.promise = new Promise((resolve, reject) => {
      st.resolve = resolve;
      st.reject = reject;
    });
  }
  return st.promise;
}

function receive(msg, buffers) {
  if (!msg || msg.type !== "plotly.js") return;
  const st = pageState();
  if (pagePlotly()) {
    waitForPlotly();
    if (st.resolve) st.resolve(pagePlotly());
    return;
  }
  if (st.loading) return;
  st.loading = true;
  st.requested = true;
  waitForPlotly();
  evaluate(buffers[0]).then(
    (P) => st.resolve(P),
    (err) => {
      st.loading = false;
      st.requested = false;
      const rej = st.reject;
      st.promise = null;
      rej(err);
    },
  );
}

function request(model) {
  const st = pageState();
  if (pagePlotly() || st.requested || st.loading) return;
  st.requested = true;
  model.send({ type: "plotly.js?" });
}

function initialize({ model }) {
  model.on("msg:custom", receive);
  return () => model.off("msg:custom", receive);
}

function render({ model, el }) {
  el.classList.add("autoplan-plot");
  const note = document.createElement("div");
  note.className = "autoplan-plot-note";
  const div = document.createElement("div");
  div.className = "autoplan-plot-div";
  el.appendChild(note);
  el.appendChild(div);
  let P = null;
  let drawn = false;
  let alive = true;

  const config = () => Object.assign({ displaylogo: false, responsive: true },
                                     model.get("config") || {});
  const draw = () => {
    if (!P || !alive) return;
    const fig = model.get("figure") || {};
    const layout = Object.assign({}, fig.layout || {});
    if (layout.width === undefined || layout.width === null) layout.autosize = true;
    P.react(div, fig.data || [], layout, config()).then(() => {
      if (!drawn) {
        drawn = true;
        div.on("plotly_click", (ev) => {
          const p = ev && ev.points && ev.points[0];
          if (!p) return;
          model.send({
            type: "click", trace: p.curveNumber,
            point: Array.isArray(p.pointNumber) ? p.pointNumber : [p.pointNumber],
            x: p.x === undefined ? null : p.x, y: p.y === undefined ? null : p.y,
            customdata: p.customdata === undefined ? null : p.customdata,
          });
        });
      }
      el.dataset.traces = String((fig.data || []).length);
    });
  };
  const onFigure = () => draw();
  model.on("change:figure", onFigure);
  model.on("change:config", onFigure);

  let timer = null;
  const resize = new ResizeObserver(() => {
    if (!drawn || !P) return;
    clearTimeout(timer);
    timer = setTimeout(() => { if (alive && div.isConnected) P.Plots.resize(div); }, 60);
  });
  resize.observe(el);

  note.textContent = "";
  if (!pagePlotly()) {
    if (el.closest(".jupyter-widgets-disconnected")) {
      // drawn from the widget state saved with the notebook: no kernel will answer (ipywidgets
      // marks a view whose model has no live comm as disconnected)
      note.textContent = "no kernel holds this figure: run the cell to draw it";
      el.dataset.disconnected = "1";
      return () => {
        alive = false;
        resize.disconnect();
        model.off("change:figure", onFigure);
        model.off("change:config", onFigure);
      };
    }
    note.textContent = "loading plotly.js from the kernel\u2026";
    request(model);
  }
  waitForPlotly().then(
    (plotly) => { P = plotly; note.textContent = ""; draw(); },
    (err) => { note.textContent = "plotly.js could not be loaded: " + err + ". Run the cell again."; },
  );

  return () => {
    alive = false;
    resize.disconnect();
    model.off("change:figure", onFigure);
    model.off("change:config", onFigure);
    if (P && drawn) P.purge(div);
  };
}

export default { initialize, render };
