// Validates Kubernetes manifests against the API's published OpenAPI schemas,
// as bundled by the npm package kubernetes-models (pinned in package-lock.json
// with its integrity hash; the Kubernetes release its schemas come from is in
// its README). Reads a JSON array of {file, index, doc} on stdin (one entry per
// YAML document; tests/deploy/check.sh converts the YAML with python3-yaml),
// prints one line per document and exits 1 if any is refused.
//
// Each document is checked the way the API server checks what
// `kubectl apply --validate=strict` sends it:
//  - apiVersion and kind name a resource of the API (a model in the package);
//  - the document matches the resource's schema: types, required fields,
//    formats (the package's ajv validator);
//  - strict field validation: every field is one the schema defines. The
//    published schemas do not forbid other fields (the API server refuses
//    them by itself), so the validator's reads are watched: a field of the
//    document that the schema never looked at is unknown to it
//    ('unknown field "spec.template.spec.containers[0].imgae"'), as the API
//    server words it.
"use strict";

const fs = require("fs");
const path = require("path");

const MODELS = path.dirname(require.resolve("kubernetes-models/package.json"));

function modelFor(apiVersion, kind) {
    if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z0-9]+$/.test(kind)) {
        return { error: "apiVersion and kind must be strings" };
    }
    // "v1" is the core group (kubernetes-models/v1/Pod); "apps/v1" a named one
    const parts = apiVersion.split("/");
    if (parts.length > 2 || parts.some((p) => !/^[a-z0-9.-]+$/.test(p))) {
        return { error: `no such apiVersion "${apiVersion}"` };
    }
    const file = path.join(MODELS, ...parts, `${kind}.js`);
    if (!fs.existsSync(file)) {
        const dir = path.join(MODELS, ...parts);
        return {
            error: fs.existsSync(dir)
                ? `no kind "${kind}" in ${apiVersion} (the API has no such resource)`
                : `no such apiVersion "${apiVersion}"`,
        };
    }
    const cls = require(file)[kind];
    if (!cls || cls.apiVersion !== apiVersion || cls.kind !== kind) {
        return { error: `${apiVersion}/${kind} is not a resource of the API` };
    }
    return { cls };
}

// watch(value, at, seen): a proxy of value that records in seen the path of
// every property the validator reads or tests for.
function watch(value, at, seen) {
    if (value === null || typeof value !== "object") return value;
    const isArray = Array.isArray(value);
    return new Proxy(value, {
        get(target, key, receiver) {
            const v = Reflect.get(target, key, receiver);
            if (typeof key !== "string" || !Object.prototype.hasOwnProperty.call(target, key)) return v;
            const p = isArray ? `${at}[${key}]` : at ? `${at}.${key}` : key;
            if (!isArray) seen.add(p);
            return watch(v, p, seen);
        },
        has(target, key) {
            if (typeof key === "string" && !isArray) seen.add(at ? `${at}.${key}` : key);
            return Reflect.has(target, key);
        },
    });
}

// every field path of the document
function fields(value, at, out) {
    if (value === null || typeof value !== "object") return out;
    if (Array.isArray(value)) {
        value.forEach((v, i) => fields(v, `${at}[${i}]`, out));
        return out;
    }
    for (const k of Object.keys(value)) {
        const p = at ? `${at}.${k}` : k;
        out.push(p);
        fields(value[k], p, out);
    }
    return out;
}

function validate(doc) {
    if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return ["the document is not an object"];
    const m = modelFor(doc.apiVersion, doc.kind);
    if (m.error) return [m.error];
    const errors = [];
    const seen = new Set();
    try {
        // the model's validate() runs the schema's validator on `this`
        m.cls.prototype.validate.call(watch(doc, "", seen));
    } catch (e) {
        errors.push(`schema: ${e.message}`);
    }
    if (seen.size === 0) errors.push("the schema's validator read no field: cannot tell known fields from unknown ones");
    for (const f of fields(doc, "", [])) {
        if (!seen.has(f)) errors.push(`unknown field "${f}"`);
    }
    return errors;
}

function main() {
    const docs = JSON.parse(fs.readFileSync(0, "utf8"));
    const version = require("kubernetes-models/package.json").version;
    const k8s = (fs.readFileSync(path.join(MODELS, "README.md"), "utf8").match(/kubernetes-(\d+\.\d+\.\d+)-green/) || [])[1];
    let bad = 0;
    for (const { file, index, doc } of docs) {
        const name = doc && doc.metadata && doc.metadata.name;
        const what = `${file}#${index} ${doc && doc.kind}/${name}`;
        const errors = validate(doc);
        if (errors.length) {
            bad++;
            console.log(`FAIL ${what}: ${errors.join("; ")}`);
        } else {
            console.log(`ok ${what}`);
        }
    }
    console.log(`kubernetes-models ${version} (Kubernetes ${k8s || "?"} schemas): ${docs.length - bad} of ${docs.length} documents valid`);
    process.exit(bad ? 1 : docs.length ? 0 : 1);
}

main();
