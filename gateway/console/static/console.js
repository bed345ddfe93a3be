// The console's only script: refresh fragments, post actions with the CSRF token, explain, create keys.
"use strict";
(function () {
  const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-csrf-token": csrf() },
      body: body === undefined ? "{}" : body,
    });
    const type = response.headers.get("content-type") || "";
    const payload = type.includes("json") ? await response.json() : await response.text();
    if (!response.ok) {
      const message = payload && payload.error ? payload.error.message : String(payload);
      throw new Error(message || `HTTP ${response.status}`);
    }
    return payload;
  }

  function flash(message, kind) {
    let box = document.getElementById("flash");
    if (!box) {
      box = document.createElement("p");
      box.id = "flash";
      box.setAttribute("role", "status");
      document.querySelector("main").prepend(box);
    }
    box.className = kind || "info";
    box.textContent = message;
  }

  async function refresh(element) {
    if (!element || document.hidden) return;
    const response = await fetch(element.dataset.fragment, { credentials: "same-origin" });
    if (response.status === 401) { window.location.assign("/console/login"); return; }
    if (response.ok) {
      element.innerHTML = await response.text();
      element.dispatchEvent(new Event("refreshed"));
    }
  }

  document.querySelectorAll("[data-every]").forEach((element) => {
    const every = Number(element.dataset.every) || 3000;
    setInterval(() => refresh(element).catch(() => {}), every);
  });

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      await post(button.dataset.action);
      flash(`${button.textContent.trim()}: done.`, "info");
      if (button.dataset.keyId && button.dataset.keyId === newKey.id) clearNewKey("it was revoked");
      await refresh(document.getElementById(button.dataset.refreshAfter));
    } catch (error) {
      flash(error.message, "error");
      button.disabled = false;
    }
  });

  const explain = document.getElementById("explain");
  if (explain) {
    explain.addEventListener("submit", async (event) => {
      event.preventDefault();
      const result = document.getElementById("explain-result");
      const problem = document.getElementById("explain-error");
      const endpoint = encodeURIComponent(explain.elements.endpoint.value);
      problem.hidden = true;
      problem.textContent = "";
      try {
        result.innerHTML = await post(`/console/explain?endpoint=${endpoint}`, explain.elements.body.value);
      } catch (error) {
        // Next to the form the operator is looking at, not in a banner at the top of the page.
        result.innerHTML = "";
        problem.textContent = `Not explained: ${error.message}`;
        problem.hidden = false;
      }
    });
  }

  // The key just created: shown once, cleared once copied or revoked.
  const newKey = { id: null };
  function clearNewKey(why) {
    const box = document.getElementById("new-key");
    if (!box || box.hidden) return;
    document.getElementById("new-key-value").textContent = "";
    box.hidden = true;
    newKey.id = null;
    if (why) flash(`The new key is no longer shown: ${why}.`, "info");
  }
  const copy = document.getElementById("copy-key");
  if (copy) {
    copy.addEventListener("click", async () => {
      const value = document.getElementById("new-key-value").textContent;
      try {
        await navigator.clipboard.writeText(value);
        clearNewKey("it was copied to the clipboard");
      } catch (error) {
        flash(`Copying failed (${error.message}): select the key and copy it by hand.`, "error");
      }
    });
    document.getElementById("hide-key").addEventListener("click", () => clearNewKey(""));
  }

  // Search and filter the keys table; applied again after each refresh of the table.
  const search = document.getElementById("key-search");
  const filter = document.getElementById("key-filter");
  function applyKeyFilter() {
    const rows = document.querySelectorAll("#keys table.keys tbody tr");
    const words = (search.value || "").toLowerCase().trim().split(/\s+/).filter(Boolean);
    const tag = filter.value;
    let shown = 0;
    rows.forEach((row) => {
      const text = row.textContent.toLowerCase();
      const tags = (row.dataset.tags || "").split(" ");
      const visible = words.every((w) => text.includes(w)) && (tag === "all" || tags.includes(tag));
      row.hidden = !visible;
      if (visible) shown += 1;
    });
    document.getElementById("key-count").textContent = `${shown} of ${rows.length} keys`;
  }
  if (search && filter) {
    search.addEventListener("input", applyKeyFilter);
    filter.addEventListener("change", applyKeyFilter);
    document.getElementById("keys").addEventListener("refreshed", applyKeyFilter);
    applyKeyFilter();
  }

  const create = document.getElementById("create-key");
  if (create) {
    create.addEventListener("submit", async (event) => {
      event.preventDefault();
      const fields = {};
      for (const input of create.elements) {
        if (!input.name || input.value.trim() === "") continue;
        const value = input.value.trim();
        if (input.name === "models") fields.models = value.split(",").map((m) => m.trim()).filter(Boolean);
        else if (input.type === "number") fields[input.name] = Number(value);
        else fields[input.name] = value;
      }
      try {
        const created = await post("/console/keys", JSON.stringify(fields));
        document.getElementById("new-key-value").textContent = created.key;
        document.getElementById("new-key-id").textContent = created.id;
        document.getElementById("new-key").hidden = false;
        newKey.id = created.id;
        flash(`Key ${created.id} created.`, "info");
        create.reset();
        await refresh(document.getElementById("keys"));
      } catch (error) {
        flash(error.message, "error");
      }
    });
  }
})();
