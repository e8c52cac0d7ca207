// The runs list: archive and delete through the API; states change live.
import * as arch from "./common.js";

document.querySelectorAll("#runs tr[data-run]").forEach((row) => {
  const id = row.dataset.run;
  const name = row.querySelector("td a").textContent;
  const archive = row.querySelector("[data-archive]");
  if (archive) archive.addEventListener("click", async () => {
    const archived = archive.dataset.archive === "true";
    const done = await arch.act(archive, (archived ? "Archive " : "Unarchive ") + name,
      () => arch.api("PATCH", `/api/runs/${id}`, {archived}));
    if (done) row.remove();
  });
  const remove = row.querySelector("[data-delete]");
  if (remove) remove.addEventListener("click", async () => {
    if (!confirm(`Delete run ${name}, its events and its checkpoints?`)) return;
    const done = await arch.act(remove, "Delete " + name,
      () => arch.api("DELETE", `/api/runs/${id}`));
    if (done) row.remove();
  });
});

arch.socket("/ws/runs/", (message) => {
  const row = document.querySelector(`#runs tr[data-run="${message.run}"]`);
  if (!row) return;
  if (message.type === "run_state") {
    const cell = row.querySelector("[data-field=state]");
    cell.textContent = message.state;
    cell.className = "state " + message.state;
  } else if (message.type === "run_progress") {
    row.querySelector("[data-field=progress]").style.width =
      (100 * message.progress).toFixed(1) + "%";
    row.querySelector("[data-field=tokens]").title = `${message.tokens} tokens`;
  }
});
