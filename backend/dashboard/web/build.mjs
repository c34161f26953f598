// Builds the dashboard into ../static: the page, and its assets under content-hashed names
// (served with a year's caching). No bundler: uPlot's browser build is copied as npm installed
// it, next to our own script and styles. Run by `make dashboard` after `npm ci`.
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "static");
const assets = join(out, "assets");

const sources = {
  UPLOT_JS: ["node_modules/uplot/dist/uPlot.iife.min.js", "uplot", "js"],
  UPLOT_CSS: ["node_modules/uplot/dist/uPlot.min.css", "uplot", "css"],
  APP_JS: ["src/app.js", "app", "js"],
  APP_CSS: ["src/app.css", "app", "css"],
};

rmSync(out, { recursive: true, force: true });
mkdirSync(assets, { recursive: true });
let page = readFileSync(join(here, "src/index.html"), "utf8");
for (const [key, [path, stem, ext]] of Object.entries(sources)) {
  const body = readFileSync(join(here, path));
  const hash = createHash("sha256").update(body).digest("hex").slice(0, 12);
  const name = `${stem}.${hash}.${ext}`;
  writeFileSync(join(assets, name), body);
  page = page.replaceAll(`{{${key}}}`, `/dashboard/assets/${name}`);
}
if (page.includes("{{")) throw new Error("index.html names an asset the build does not know");
writeFileSync(join(out, "index.html"), page);
console.log(`dashboard built into ${out}`);
