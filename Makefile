# shoal: one library (build/libshoal.a), one binary (build/shoal), tests and benches.
# Every source file under src/ (src/<part>/<component>/ or src/common/) is part of
# the library except src/cli/, which holds the command line.  Adding a file needs no change here.

PKGS      := libzstd libxxhash ucx libmicrohttpd jansson openblas sqlite3 libpq libseccomp nettle
CC        ?= gcc
BUILD     := build
ASAN      := $(BUILD)/asan
GEN       := $(BUILD)/gen
SHARED    ?= $(abspath ../shared)
# `make V=1` shows every compiler command.
Q         := $(if $(V),,@)
NPROC     := $(shell nproc 2>/dev/null || echo 2)

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LIBS       := $(PKG_LIBS) -lpthread -lm
TEST_LIBS  := $(shell pkg-config --libs cmocka 2>/dev/null)

WARN      := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation
BASEFLAGS := -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -I$(GEN) $(PKG_CFLAGS) $(WARN) -MMD -MP
OPTFLAGS  := -O2 -g
SANFLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined

LIB_SRC   := $(sort $(filter-out src/cli/%,$(wildcard src/*/*.c src/*/*/*.c src/*/*/*/*.c)))
CLI_SRC   := $(sort $(wildcard src/cli/*.c bench/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_AUX  := $(sort $(filter-out tests/test_%,$(wildcard tests/*.c)))
FUZZ_SRC  := $(sort $(wildcard fuzz/fuzz_*.c))

# build/shoal is the client: the commands that only talk to a server, linked
# without UCX, OpenBLAS or SQLite so that it starts fast; it hands every
# other command to build/shoal-core, which holds them all (src/cli/main.c).
CLIENT_CMDS := submit jobs job logs cancel nodes cost version service
CLIENT_SRC  := $(CLIENT_CMDS:%=src/cli/cmd_%.c) src/cli/ctl.c src/cli/opts.c
CLIENT_LIBS := $(shell pkg-config --libs jansson libxxhash 2>/dev/null) -lm

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/pic/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
AUX_OBJ   := $(TEST_AUX:%.c=$(BUILD)/obj/%.o)
TESTS     := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

ALIB_OBJ  := $(LIB_SRC:%.c=$(ASAN)/obj/%.o)
ACLI_OBJ  := $(CLI_SRC:%.c=$(ASAN)/obj/%.o)
AAUX_OBJ  := $(TEST_AUX:%.c=$(ASAN)/obj/%.o)
ATESTS    := $(TEST_SRC:tests/%.c=$(ASAN)/tests/%)

FUZZERS   := $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_TIME ?= 30

# The shared library's version comes from the one the binary prints.
VERSION   := $(shell sed -n 's/^\#define SHOAL_VERSION "\(.*\)"/\1/p' include/shoal/common.h)
SOMAJOR   := $(firstword $(subst ., ,$(VERSION)))
SONAME    := libshoal.so.$(SOMAJOR)
LIBFLAGS  := -fPIC -fvisibility=hidden
PREFIX    ?= /usr/local
DESTDIR   ?=

.PHONY: all deps test test-opt test-asan run run-torch bench fuzz clean install mutants mutants-gen
all: $(BUILD)/shoal $(BUILD)/shoal-core $(BUILD)/libshoal.a $(BUILD)/$(SONAME) $(BUILD)/shoal.1

deps:
	@sh scripts/deps.sh

# The command table is generated from the file names src/cli/cmd_<name>.c and
# bench/bench_<name>.c (benchmarks live in bench/, outside the command line), so that components add commands without touching a
# shared list.
$(GEN)/commands.h: $(CLI_SRC) scripts/gen-commands.sh | $(GEN)
	@sh scripts/gen-commands.sh $(CLI_SRC) > $@.tmp && mv $@.tmp $@

$(GEN)/client-commands.h: Makefile scripts/gen-commands.sh | $(GEN)
	@sh scripts/gen-commands.sh $(CLIENT_SRC) > $@.tmp && mv $@.tmp $@

$(GEN):
	@mkdir -p $@

$(BUILD)/obj/%.o: %.c | $(GEN)/commands.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(OPTFLAGS) $(CFLAGS) -c $< -o $@

$(ASAN)/obj/%.o: %.c | $(GEN)/commands.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(SANFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/pic/%.o: %.c | $(GEN)/commands.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(OPTFLAGS) $(LIBFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/libshoal.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(ASAN)/libshoal.a: $(ALIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/shoal-core: $(CLI_OBJ) $(BUILD)/libshoal.a
	$(CC) $(OPTFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libshoal.a $(LIBS)

$(ASAN)/shoal-core: $(ACLI_OBJ) $(ASAN)/libshoal.a
	$(CC) $(SANFLAGS) -o $@ $(ACLI_OBJ) $(ASAN)/libshoal.a $(LIBS)

# The man page is generated from the binary's own help text.
$(BUILD)/shoal.1: $(BUILD)/shoal $(BUILD)/shoal-core scripts/gen-man.sh
	@sh scripts/gen-man.sh $(BUILD)/shoal $(VERSION) > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/client/main.o: src/cli/main.c $(GEN)/client-commands.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(OPTFLAGS) $(CFLAGS) -DSHOAL_CLIENT -c $< -o $@

$(ASAN)/obj/client/main.o: src/cli/main.c $(GEN)/client-commands.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(BASEFLAGS) $(SANFLAGS) $(CFLAGS) -DSHOAL_CLIENT -c $< -o $@

$(BUILD)/shoal: $(BUILD)/obj/client/main.o $(CLIENT_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/libshoal.a | $(BUILD)/shoal-core
	$(CC) $(OPTFLAGS) -Wl,--as-needed -o $@ $(filter %.o,$^) $(BUILD)/libshoal.a $(CLIENT_LIBS)

$(ASAN)/shoal: $(ASAN)/obj/client/main.o $(CLIENT_SRC:%.c=$(ASAN)/obj/%.o) $(ASAN)/libshoal.a | $(ASAN)/shoal-core
	$(CC) $(SANFLAGS) -Wl,--as-needed -o $@ $(filter %.o,$^) $(ASAN)/libshoal.a $(CLIENT_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(AUX_OBJ) $(BUILD)/libshoal.a
	@mkdir -p $(dir $@)
	$(CC) $(OPTFLAGS) -o $@ $< $(AUX_OBJ) $(BUILD)/libshoal.a $(LIBS) $(TEST_LIBS)

# test_props_agent preloads a mount(2) that fails on demand into an agent.
$(BUILD)/tests/fault_mount.so: tests/fault/mount.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -shared -fPIC -o $@ $< -ldl
$(BUILD)/tests/test_props_agent $(ASAN)/tests/test_props_agent: $(BUILD)/tests/fault_mount.so

# test_runs starts ranks that `import shoal` (python/shoal loads build/libshoal.so.0).
$(BUILD)/tests/test_runs $(ASAN)/tests/test_runs: $(BUILD)/$(SONAME)

$(ASAN)/tests/%: $(ASAN)/obj/tests/%.o $(AAUX_OBJ) $(ASAN)/libshoal.a
	@mkdir -p $(dir $@)
	$(CC) $(SANFLAGS) -o $@ $< $(AAUX_OBJ) $(ASAN)/libshoal.a $(LIBS) $(TEST_LIBS)

# Tests run twice: optimised, and under AddressSanitizer + UBSan.  The runner
# prints one "N passed, N failed" line for the whole suite.
test: deps
	@python3 scripts/check-layers.py
	@python3 scripts/mutants.py --list > /dev/null
	@$(MAKE) --no-print-directory -j$(NPROC) all $(ASAN)/shoal $(TESTS) $(ATESTS)
	@SHOAL_SHARED=$(SHARED) sh scripts/run-tests.sh $(TESTS) $(ATESTS)

test-opt: all $(TESTS)
	@SHOAL_SHARED=$(SHARED) sh scripts/run-tests.sh $(TESTS)

test-asan: $(ASAN)/shoal $(ATESTS)
	@SHOAL_SHARED=$(SHARED) sh scripts/run-tests.sh $(ATESTS)

run: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(BUILD)/shoal run $(RUN_ARGS)

# Asynchronous GRPO in PyTorch on a local fleet (examples/torch-rl/run.py;
# Debian's python3-torch is /usr/bin/python3's).
run-torch: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@/usr/bin/python3 examples/torch-rl/run.py $(RUN_ARGS)

bench: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@sh scripts/bench.sh

# Mutation testing (docs/testing.md): each mutant in tests/mutants.txt is
# applied to a private copy of the tree (build/mut/tree), built there and run
# against the tests it names; any survivor not marked equivalent, or any
# stale entry, fails.  MUTANTS="--only ID,ID" runs a few.
mutants: deps
	@python3 scripts/mutants.py $(MUTANTS)

# Generated mutants (docs/testing.md): scripts/mutgen.py makes every mutant of
# the files tests/mutgen.txt lists and runs the checked-in sample of 400,
# tests/mutgen-sample.txt (SEED=N draws another, FULL=1 runs all, JOBS=N in
# parallel, MUTGEN="--only ID" one).  Not part of `make test`.
JOBS ?= 1
mutants-gen: deps
	@python3 scripts/mutgen.py $(if $(SEED),--seed $(SEED)) -j $(JOBS) $(if $(FULL),--full) $(MUTGEN)

# libFuzzer targets, built with clang against the library sources.
$(BUILD)/fuzz/%: fuzz/%.c $(LIB_SRC) | $(GEN)/commands.h
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -I$(GEN) $(PKG_CFLAGS) -g -O1 \
	    -fsanitize=fuzzer,address,undefined -o $@ $< $(LIB_SRC) $(LIBS)

fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZERS)
	@for f in $(FUZZERS); do n=$$(basename $$f); mkdir -p fuzz/corpus/$$n $(BUILD)/fuzz/$$n.new; \
	    echo "fuzz: $$n for $(FUZZ_TIME)s"; \
	    $$f -max_total_time=$(FUZZ_TIME) -artifact_prefix=fuzz/ $(BUILD)/fuzz/$$n.new fuzz/corpus/$$n \
	        > $(BUILD)/fuzz/$$n.log 2>&1; rc=$$?; tail -3 $(BUILD)/fuzz/$$n.log; \
	    [ $$rc -eq 0 ] || { echo "fuzz: $$n failed (exit $$rc), see $(BUILD)/fuzz/$$n.log"; exit 1; }; done

clean:
	rm -rf $(BUILD)

# ---- The shared library, pkg-config and install -------------------------
# Library objects are position-independent and hidden by default: only what
# the public headers declare (between their `#pragma GCC visibility` lines)
# is exported from libshoal.so; internal `__` names stay inside.  The static
# archive is built from the same objects.
PYDIR     := lib/python3/dist-packages

$(BUILD)/libshoal.so.$(VERSION): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,-z,defs -o $@ $^ $(LIBS)

$(BUILD)/$(SONAME): $(BUILD)/libshoal.so.$(VERSION)
	@ln -sf libshoal.so.$(VERSION) $@ && ln -sf libshoal.so.$(VERSION) $(BUILD)/libshoal.so

# `make install PREFIX=DIR` (and DESTDIR=... for packaging): the binary, both
# libraries, the headers, shoal.pc and the Python package, which is told
# where its library lies (python/shoal/_libdir.py).
install: all
	@d=$(DESTDIR)$(PREFIX); set -e; \
	install -d $$d/bin $$d/libexec/shoal $$d/lib/pkgconfig $$d/include/shoal $$d/$(PYDIR)/shoal; \
	install -m 755 $(BUILD)/shoal $$d/bin/shoal; \
	install -m 755 $(BUILD)/shoal-core $$d/libexec/shoal/shoal-core; \
	install -d $$d/share/man/man1 $$d/share/bash-completion/completions $$d/share/shoal/web; \
	install -m 644 $(BUILD)/shoal.1 $$d/share/man/man1/shoal.1; \
	install -m 644 scripts/shoal-completion.bash $$d/share/bash-completion/completions/shoal; \
	install -m 644 web/* $$d/share/shoal/web/; \
	install -m 644 $(BUILD)/libshoal.a $$d/lib/libshoal.a; \
	install -m 755 $(BUILD)/libshoal.so.$(VERSION) $$d/lib/libshoal.so.$(VERSION); \
	ln -sf libshoal.so.$(VERSION) $$d/lib/$(SONAME); ln -sf libshoal.so.$(VERSION) $$d/lib/libshoal.so; \
	install -m 644 include/shoal/*.h $$d/include/shoal/; \
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' scripts/shoal.pc.in > $$d/lib/pkgconfig/shoal.pc; \
	install -m 644 python/shoal/*.py $$d/$(PYDIR)/shoal/; \
	echo "LIBDIR = '$(PREFIX)/lib'" > $$d/$(PYDIR)/shoal/_libdir.py; \
	echo "installed shoal $(VERSION) under $$d (pkg-config: PKG_CONFIG_PATH=$$d/lib/pkgconfig;" \
	     "python: PYTHONPATH=$$d/$(PYDIR))"

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(ALIB_OBJ:.o=.d) $(ACLI_OBJ:.o=.d)
-include $(BUILD)/obj/client/main.d $(ASAN)/obj/client/main.d
-include $(TEST_SRC:%.c=$(BUILD)/obj/%.d) $(TEST_SRC:%.c=$(ASAN)/obj/%.d)

# Test objects are not intermediates: keep them so that relinks are cheap.
.SECONDARY:
