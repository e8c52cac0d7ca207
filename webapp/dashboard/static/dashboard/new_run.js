// The new-run form: a preset reloads the form with its values; island rows are added
// and removed here and renumbered so the server reads them in order.
"use strict";

document.getElementById("preset").addEventListener("change", (e) => {
  location.search = "?preset=" + encodeURIComponent(e.target.value);
});

const rows = document.getElementById("island-rows");

function renumber() {
  rows.querySelectorAll("tr.island-row").forEach((row, i) => {
    row.querySelectorAll("[name]").forEach((input) => {
      input.name = input.name.replace(/^islands-\d+-/, `islands-${i}-`);
    });
  });
}

function wire(row) {
  row.querySelector("[data-remove-island]").addEventListener("click", () => {
    if (rows.querySelectorAll("tr.island-row").length > 1) { row.remove(); renumber(); }
  });
}

rows.querySelectorAll("tr.island-row").forEach(wire);

document.getElementById("add-island").addEventListener("click", () => {
  const last = rows.querySelector("tr.island-row:last-child");
  const row = last.cloneNode(true);
  row.querySelectorAll(".errorlist").forEach((e) => e.remove());
  const names = new Set([...rows.querySelectorAll("input[name$='-name']")].map((i) => i.value));
  let n = names.size;
  while (names.has(`island-${n}`)) n += 1;
  row.querySelector("input[name$='-name']").value = `island-${n}`;
  rows.appendChild(row);
  wire(row);
  renumber();
});
