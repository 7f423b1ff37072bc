// Probe writes and commands that wait for the user's approval, shown on the phone page.
// Polls GET /api/probes/approvals; Approve sends the args_hash the person saw, so a changed
// argument needs a new approval (the server answers 409 args_changed).
(function () {
  "use strict";
  const section = document.getElementById("p-approvals");
  const list = document.getElementById("p-approvals-list");
  if (!section || !list) return;

  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([key, value]) => {
      if (key === "text") node.textContent = value;
      else if (key === "onclick") node.addEventListener("click", value);
      else node.setAttribute(key, value);
    });
    (children || []).forEach((child) => node.appendChild(child));
    return node;
  }

  function diffBlock(text) {
    const pre = el("pre", { class: "diff" });
    text.split("\n").forEach((line) => {
      const span = el("span", { text: line + "\n" });
      if (line.startsWith("+") && !line.startsWith("+++")) span.className = "ok";
      else if (line.startsWith("-") && !line.startsWith("---")) span.className = "bad";
      pre.appendChild(span);
    });
    return pre;
  }

  function describe(command) {
    const args = command.args || {};
    if (command.op === "write") return diffBlock(command.preview || args.diff || "(preparing the diff…)");
    if (args.argv) return el("pre", { text: args.argv.join(" ") + (args.cwd ? "\n(in " + args.cwd + ")" : "") });
    return el("pre", { text: JSON.stringify(args, null, 2) });
  }

  async function decide(command, action, button) {
    button.disabled = true;
    const body = action === "approve" ? { args_hash: command.args_hash } : {};
    const response = await fetch(`/api/probes/commands/${command.id}/${action}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      button.parentNode.appendChild(el("p", { class: "bad", text: error.detail || `Refused (${response.status}).` }));
    }
    refresh();
  }

  function render(commands) {
    list.replaceChildren();
    section.hidden = commands.length === 0;
    commands.forEach((command) => {
      const approve = el("button", { class: "primary", type: "button", "data-testid": "phone-approve", text: "Approve" });
      const skip = el("button", { type: "button", "data-testid": "phone-skip", text: "Skip" });
      approve.addEventListener("click", () => decide(command, "approve", approve));
      skip.addEventListener("click", () => decide(command, "reject", skip));
      list.appendChild(el("div", { class: "card", "data-testid": "probe-approval", "data-id": command.id }, [
        el("strong", { text: `${command.probe.name}: ${command.op} ${command.args.path || ""}` }),
        describe(command),
        el("div", { class: "row" }, [approve, skip]),
      ]));
    });
  }

  async function refresh() {
    try {
      const response = await fetch("/api/probes/approvals", { credentials: "same-origin" });
      if (response.ok) render(await response.json());
    } catch (error) {
      // Offline for a moment: the next tick tries again.
    }
  }

  refresh();
  setInterval(refresh, 5000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
})();
