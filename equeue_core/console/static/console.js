// EQueue console: body preview tabs, DLQ select-all, and the live lag chart of a group page.
(function () {
  "use strict";

  // Body previews: one tab per view (text, JSON, hex); the default is chosen by the server.
  document.querySelectorAll(".preview").forEach(function (box) {
    function show(view) {
      box.querySelectorAll("pre.body").forEach(function (pre) { pre.hidden = pre.dataset.view !== view; });
      box.querySelectorAll(".tabs button").forEach(function (b) { b.classList.toggle("active", b.dataset.view === view); });
    }
    box.querySelectorAll(".tabs button").forEach(function (b) {
      b.addEventListener("click", function () { show(b.dataset.view); });
    });
    show(box.dataset.default);
  });

  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input[name=msg_id]").forEach(function (c) { c.checked = all.checked; });
    });
  }

  // A group page: poll the lag every 2 s, redraw the chart and update the queue table in place.
  var chartBox = document.getElementById("lag-chart");
  if (!chartBox || typeof uPlot === "undefined") return;
  var group = chartBox.dataset.group;
  var plot = null, plotKeys = "";
  var palette = ["#2962c9", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d"];

  function draw(series) {
    var keys = Object.keys(series.queues);
    var data = [series.t, series.total].concat(keys.map(function (k) { return series.queues[k]; }));
    var width = Math.max(320, chartBox.clientWidth - 16);
    if (plot && plotKeys === keys.join("|")) { plot.setData(data); return; }
    if (plot) plot.destroy();
    plotKeys = keys.join("|");
    var lines = [{}, { label: "total lag", stroke: "#18243a", width: 2 }].concat(keys.map(function (k, i) {
      return { label: k, stroke: palette[i % palette.length], width: 1 };
    }));
    plot = new uPlot({ width: width, height: 280, series: lines, scales: { x: { time: true } },
                       axes: [{}, { label: "messages behind" }] }, data, chartBox);
  }

  function update(body) {
    document.getElementById("total-lag").textContent = body.lag;
    document.getElementById("member-count").textContent = body.members.length;
    body.queues.forEach(function (r) {
      var key = (r.broker ? r.broker + ":" : "") + r.topic + "/" + r.queue_id;  // a cluster's rows carry their broker
      var row = document.querySelector('tr[data-queue="' + CSS.escape(key) + '"]');
      if (!row) return;
      row.querySelector(".committed").textContent = r.committed === null ? "-" : r.committed;
      row.querySelector(".max").textContent = r.max_offset;
      row.querySelector(".lag").textContent = r.lag;
      row.querySelector(".owner").textContent = r.owner || "-";
    });
    var members = document.querySelector("#members tbody");
    if (members) {
      members.textContent = "";
      body.members.forEach(function (m) {
        var subs = Object.keys(m.subscriptions).map(function (t) { return t + " (" + m.subscriptions[t] + ")"; });
        var queues = m.queues.map(function (q) { return q[0] + "/" + q[1]; });
        var tr = document.createElement("tr");
        (m.broker ? [m.broker] : []).concat([m.client_id, m.mode, subs.join(", "), queues.join(" ")]).forEach(function (text) {
          var td = document.createElement("td");
          td.textContent = text;
          tr.appendChild(td);
        });
        members.appendChild(tr);
      });
      if (!body.members.length) {
        var tr = document.createElement("tr"), td = document.createElement("td");
        td.colSpan = document.querySelectorAll("#members thead th").length;
        td.textContent = "no consumer is connected";
        tr.appendChild(td);
        members.appendChild(tr);
      }
    }
    draw(body.series);
  }

  function poll() {
    fetch("/api/groups/" + encodeURIComponent(group) + "/lag", { cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) { if (body) update(body); })
      .catch(function () {})
      .finally(function () { setTimeout(poll, 2000); });
  }
  poll();
})();
