// Package customlayout shows how a serving framework adds its own KV-cache
// layouts to kvreshard: it declares them in a .kvl file, compiles them with
// kvlc from a go:generate line, commits the generated kernels, and imports
// the package for its side effect of registering them.
//
// custom.kvl declares three part layouts and two pool layouts:
//
//	part vllm_flash        { order L C T H D }          vLLM's per-layer flash layout
//	part flashinfer_hnd    { order L C H T D }          FlashInfer's HND
//	part vllm_xblock       { order C L H D/8 T D%8 }    vLLM's x-blocked key cache
//	pool vllm_host         { order L C S T H D }        a per-layer host pool
//	pool vllm_xblock4_host { order S C L H D/4 T D%4 }  the x-blocked cache of fp32
//
// Layouts that split an axis by different factors (D/8 and D/4 here) pair
// like any others: the compiler lowers both to a common refinement.
//
// To add a layout in your own module:
//
//  1. Write a .kvl file beside a Go file of the package that is to hold the
//     kernels (the language is documented in package
//     github.com/kvreshard/kvreshard/dsl).
//  2. Add a go:generate line such as the one in this file, naming the output
//     file, the package and the .kvl files. kvlc needs the kvreshard module
//     in your go.mod, since it runs from there.
//  3. Run go generate and commit the generated file. Run kvlc with -check in
//     CI: it exits 1 when the committed file is stale.
//  4. Import the package (a blank import is enough) in the serving process.
//     Its init registers a range kernel and a copy kernel for every pair.
//
// Only pairs within one kvlc invocation are generated: every ordered pair of
// the layouts of its .kvl files in which at least one side is a part. Pairs
// that join one of these layouts with a built-in layout (a vllm_flash part
// read into SGLang's page_first pool, say) have no generated kernels; the
// runtime runs them on its generic interpreter, which is byte-exact but
// slower. To generate them too, declare the built-in layouts you need in
// your .kvl file under your own names: kernels are registered by the
// layout's identity (its kind and order), not its name, and registering the
// same lowering twice is not a conflict.
package customlayout

//go:generate go run github.com/kvreshard/kvreshard/cmd/kvlc -o custom_kvl.go -pkg customlayout custom.kvl
