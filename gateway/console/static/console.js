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
    if (response.ok) element.innerHTML = await response.text();
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
      const endpoint = encodeURIComponent(explain.elements.endpoint.value);
      try {
        result.innerHTML = await post(`/console/explain?endpoint=${endpoint}`, explain.elements.body.value);
      } catch (error) {
        result.textContent = "";
        flash(error.message, "error");
      }
    });
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
        document.getElementById("new-key").hidden = false;
        flash(`Key ${created.id} created.`, "info");
        create.reset();
        await refresh(document.getElementById("keys"));
      } catch (error) {
        flash(error.message, "error");
      }
    });
  }
})();
