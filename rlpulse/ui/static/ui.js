// rlpulse's run page: what the run list and the run page share.
"use strict";

/** GET a JSON answer of the server; throws an Error with the server's own message. */
async function getJSON(path, params) {
  const query = new URLSearchParams(params || {}).toString();
  const response = await fetch(query ? `${path}?${query}` : path);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const reason = body && body.error ? body.error : `${response.status} ${response.statusText}`;
    throw new Error(reason);
  }
  return body;
}

/** An element with text (never HTML: run ids and log lines are shown as they are). */
function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

/** A table of rows (objects) with the given columns; cells through `show` when given. */
function table(columns, rows, rowClass, show) {
  const t = el("table");
  const head = t.createTHead().insertRow();
  for (const c of columns) head.appendChild(el("th", c));
  const body = t.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    if (rowClass) tr.className = rowClass(row);
    for (const c of columns) {
      const value = show ? show(c, row) : row[c];
      const td = el("td", value === null || value === undefined ? "" : value);
      if (c === "message") td.className = "message";
      tr.appendChild(td);
    }
  }
  return t;
}

/** Show the server's status notices (archive missing, live topics unreadable); `asked`: the
 * /api/status request if one is already under way. */
async function showStatus(box, asked) {
  try {
    const status = await (asked || getJSON("/api/status"));
    for (const problem of [status.archive_problem, status.live_problem]) {
      if (problem) box.appendChild(el("div", problem, "notice"));
    }
  } catch (e) {
    box.appendChild(el("div", `The server does not answer: ${e.message}`, "error"));
  }
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(digits || 5);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}
