// The views' style sheet, injected once. Every colour and font is one of Airflow's theme
// tokens (its Chakra UI v3 system's CSS variables, which Airflow switches between light and
// dark on <html class="dark">), so the views follow Airflow's colour mode and its theme
// (AIRFLOW__API__THEME) without a colour of their own. The fallbacks only matter outside Airflow.

const v = (token: string, fallback: string) => `var(--chakra-colors-${token}, ${fallback})`;

const PALETTES = [
  "running",
  "success",
  "failed",
  "queued",
  "deferred",
  "up_for_reschedule",
  "none",
  "teal",
  "amber",
  "orange",
];

const paletteRules = PALETTES.map(
  (p) => `
.fck [data-palette="${p}"] { --fck-solid: ${v(`${p}-solid`, "#888")}; --fck-subtle: ${v(`${p}-subtle`, "#eee")};
  --fck-fg: ${v(`${p}-fg`, "#333")}; --fck-contrast: ${v(`${p}-contrast`, "#fff")}; --fck-muted: ${v(`${p}-muted`, "#ddd")}; }`,
).join("");

export const CSS = `
.fck { color: ${v("fg", "#1a202c")}; background: ${v("bg", "#fff")}; font-family: var(--chakra-fonts-body, system-ui, sans-serif);
  font-size: 0.875rem; line-height: 1.45; padding: 12px 16px 32px; min-height: 100%; box-sizing: border-box; }
.fck *, .fck *::before, .fck *::after { box-sizing: border-box; }
.fck h1 { font-size: 1.25rem; font-weight: 600; margin: 0 0 8px; display: flex; flex-wrap: wrap; gap: 8px; align-items: center; overflow-wrap: anywhere; }
.fck h2 { font-size: 1rem; font-weight: 600; margin: 20px 0 8px; }
.fck section { margin-bottom: 8px; }
.fck a { color: ${v("fg-info", "#2563eb")}; text-decoration: none; }
.fck a:hover { text-decoration: underline; }
.fck code { font-family: var(--chakra-fonts-mono, monospace); font-size: 0.8rem; overflow-wrap: anywhere; user-select: text; }
.fck .muted { color: ${v("fg-muted", "#64748b")}; }
.fck .badge { display: inline-flex; align-items: center; gap: 4px; border-radius: 6px; padding: 1px 8px; font-size: 0.75rem; font-weight: 500;
  background: var(--fck-subtle); color: var(--fck-fg); border: 1px solid var(--fck-muted); white-space: nowrap; }
.fck .badge::before { content: ""; width: 8px; height: 8px; border-radius: 50%; background: var(--fck-solid); }
.fck .facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
.fck .facts dt { color: ${v("fg-muted", "#64748b")}; }
.fck .facts dd { margin: 0; overflow-wrap: anywhere; }
.fck button, .fck .button { font: inherit; border-radius: 6px; padding: 4px 12px; cursor: pointer; border: 1px solid ${v("border", "#ccc")};
  background: ${v("bg-panel", "#fff")}; color: ${v("fg", "#1a202c")}; }
.fck button:hover:not(:disabled) { background: ${v("bg-muted", "#f1f5f9")}; }
.fck button:disabled { opacity: 0.45; cursor: not-allowed; }
.fck button:focus-visible, .fck input:focus-visible, .fck a:focus-visible, .fck select:focus-visible { outline: 2px solid ${v("brand-focusRing", "#3b82f6")}; outline-offset: 1px; }
.fck button.solid { background: var(--fck-solid); color: var(--fck-contrast); border-color: var(--fck-solid); }
.fck button.solid:hover:not(:disabled) { filter: brightness(1.08); background: var(--fck-solid); }
.fck .toolbar { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 8px 0; }
.fck input[type=search], .fck select { font: inherit; padding: 4px 8px; border-radius: 6px; border: 1px solid ${v("border", "#ccc")};
  background: ${v("bg-panel", "#fff")}; color: ${v("fg", "#1a202c")}; }
.fck input[type=search] { min-width: 16rem; flex: 1 1 16rem; max-width: 28rem; }
.fck .chip-toggle { border-radius: 999px; padding: 2px 10px; font-size: 0.8rem; }
.fck .chip-toggle[aria-pressed=true] { background: var(--fck-subtle); border-color: var(--fck-solid); color: var(--fck-fg); font-weight: 600; }
.fck .table-wrap { overflow-x: auto; border: 1px solid ${v("border", "#e2e8f0")}; border-radius: 8px; }
.fck table { border-collapse: collapse; width: 100%; }
.fck th, .fck td { text-align: left; padding: 6px 10px; border-bottom: 1px solid ${v("border-muted", "#edf2f7")}; vertical-align: top; }
.fck th { font-weight: 600; color: ${v("fg-muted", "#64748b")}; background: ${v("bg-subtle", "#f8fafc")}; white-space: nowrap; }
.fck th button { border: none; background: none; padding: 0; font-weight: 600; color: inherit; }
.fck tbody tr:hover { background: ${v("bg-subtle", "#f8fafc")}; }
.fck td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.fck .pager { display: flex; gap: 8px; align-items: center; margin-top: 8px; flex-wrap: wrap; }
.fck .message { padding: 8px 12px; border-radius: 6px; margin: 8px 0; border: 1px solid var(--fck-muted); background: var(--fck-subtle); color: var(--fck-fg); }
.fck .graph { overflow: auto; max-width: 100%; border: 1px solid ${v("border", "#e2e8f0")}; border-radius: 8px; background: ${v("bg-subtle", "#f8fafc")}; }
.fck svg.stage-graph text { fill: ${v("fg", "#1a202c")}; font-size: 12px; font-family: inherit; }
.fck svg.stage-graph .stage-name { font-weight: 600; }
.fck svg.stage-graph .edge { stroke: ${v("fg-muted", "#64748b")}; }
.fck svg.stage-graph rect.box { fill: var(--fck-subtle); stroke: var(--fck-solid); }
.fck svg.stage-graph rect.bar-bg { fill: ${v("bg-panel", "#fff")}; }
.fck svg.stage-graph rect.bar { fill: var(--fck-solid); }
.fck .legend { display: flex; flex-wrap: wrap; gap: 6px 12px; margin: 4px 0 8px; }
.fck .menu { position: relative; display: inline-block; }
.fck .menu [role=menu] { position: absolute; right: 0; z-index: 10; min-width: 16rem; margin-top: 4px; padding: 4px; border-radius: 8px;
  border: 1px solid ${v("border", "#ccc")}; background: ${v("bg-panel", "#fff")}; box-shadow: 0 4px 16px rgba(0,0,0,.18); }
.fck .menu [role=menuitem] { display: block; width: 100%; text-align: left; border: none; background: none; }
.fck .menu [role=menuitem]:hover:not(:disabled) { background: ${v("bg-muted", "#f1f5f9")}; }
.fck .menu .why { display: block; font-size: 0.75rem; color: ${v("fg-muted", "#64748b")}; }
.fck dialog { border: 1px solid ${v("border", "#ccc")}; border-radius: 10px; padding: 16px 20px; max-width: 34rem;
  background: ${v("bg-panel", "#fff")}; color: ${v("fg", "#1a202c")}; }
.fck dialog::backdrop { background: rgba(0, 0, 0, 0.45); }
.fck dialog h3 { margin: 0 0 8px; font-size: 1rem; }
.fck .dialog-buttons { display: flex; justify-content: flex-end; gap: 8px; margin-top: 16px; }
.fck .chips { display: flex; flex-wrap: wrap; gap: 4px; }
.fck .failure { color: ${v("fg-error", "#dc2626")}; }
@media (max-width: 720px) { .fck { padding: 8px; } .fck .facts { grid-template-columns: 1fr; } .fck input[type=search] { min-width: 0; } }
${paletteRules}
`;

let injected = false;

/** Adds the style sheet to the page once (the bundle has no CSS file of its own). */
export function injectStyles(): void {
  if (injected || document.getElementById("finalckpt-ui-styles")) return;
  const style = document.createElement("style");
  style.id = "finalckpt-ui-styles";
  style.textContent = CSS;
  document.head.appendChild(style);
  injected = true;
}
