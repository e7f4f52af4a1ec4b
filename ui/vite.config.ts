// The bundle Airflow's UI loads for the plugin's react_apps (its `bundle_url`): one
// self-contained script (IIFE) whose React comes from the host page. Airflow's UI import()s the
// file, then renders the component it finds as globalThis[<app name>] (src/main.tsx sets both
// names), with the host's React and JSX runtime (Airflow sets globalThis.React and
// .ReactJSXRuntime): a React of our own would break hooks. Not UMD: a page with an AMD loader
// (define.amd) would make a UMD wrapper register a module instead of running. Written into the Python package, which serves it
// at /finalckpt/static/ui/finalckpt-ui.js and ships it in the wheel.
import { resolve } from "node:path";
import { defineConfig } from "vitest/config";

export default defineConfig({
  build: {
    outDir: resolve(__dirname, "../airflow_finalckpt/plugins/api/static/ui"),
    emptyOutDir: true,
    sourcemap: false,
    lib: {
      entry: resolve(__dirname, "src/main.tsx"),
      formats: ["iife"],
      name: "FinalckptUI",
      fileName: () => "finalckpt-ui.js",
    },
    rollupOptions: {
      external: ["react", "react-dom", "react/jsx-runtime"],
      output: {
        exports: "default",
        // the host's globals, read when the bundle runs (Airflow sets them before any plugin)
        globals: {
          react: "React",
          "react-dom": "ReactDOM",
          "react/jsx-runtime": "ReactJSXRuntime",
        },
      },
    },
  },
  define: { "process.env.NODE_ENV": JSON.stringify("production") },
  test: { environment: "node", globals: true, include: ["src/**/*.test.ts"] },
});
