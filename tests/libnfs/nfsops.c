/*
 * nfsops: runs file operations on an NFSv3 export through libnfs, an NFS
 * client implementation independent of this project. Used by the host
 * end-to-end tests for the operations Debian's libnfs-utils has no tool for.
 *
 *   nfsops URL OP [ARGS...]
 *   URL: nfs://HOST/EXPORT?nfsport=N&mountport=N&version=3
 *   OP:  mkdir P | rmdir P | rm P | stat P | mv A B | ln A B | symlink T P
 *        | readlink P | chmod P OCTAL | truncate P SIZE | mkfifo P
 *
 * stat prints "size=S mode=OCTAL nlink=N type=reg|dir|lnk|fifo|other".
 * Exit status 0 on success; on failure the NFS error is printed on stderr
 * and the exit status is 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <nfsc/libnfs.h>

static int fail(struct nfs_context *nfs, const char *what, int rc)
{
	fprintf(stderr, "nfsops: %s: %s (%d)\n", what, nfs_get_error(nfs), rc);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: nfsops URL OP ARGS...\n");
		return 2;
	}
	struct nfs_context *nfs = nfs_init_context();
	if (!nfs)
		return 2;
	struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
	if (!url) {
		fprintf(stderr, "nfsops: bad url: %s\n", nfs_get_error(nfs));
		return 2;
	}
	int rc = nfs_mount(nfs, url->server, url->path);
	if (rc)
		return fail(nfs, "mount", rc);
	const char *op = argv[2];
	const char *a = argv[3];
	const char *b = argc > 4 ? argv[4] : NULL;
	int need_b = !strcmp(op, "mv") || !strcmp(op, "ln") || !strcmp(op, "symlink") ||
		     !strcmp(op, "chmod") || !strcmp(op, "truncate");
	if (need_b && !b) {
		fprintf(stderr, "nfsops: %s needs two arguments\n", op);
		return 2;
	}
	if (!strcmp(op, "mkdir"))
		rc = nfs_mkdir(nfs, a);
	else if (!strcmp(op, "rmdir"))
		rc = nfs_rmdir(nfs, a);
	else if (!strcmp(op, "rm"))
		rc = nfs_unlink(nfs, a);
	else if (!strcmp(op, "mv"))
		rc = nfs_rename(nfs, a, b);
	else if (!strcmp(op, "ln"))
		rc = nfs_link(nfs, a, b);
	else if (!strcmp(op, "symlink"))
		rc = nfs_symlink(nfs, a, b);
	else if (!strcmp(op, "chmod"))
		rc = nfs_chmod(nfs, a, (int)strtol(b, NULL, 8));
	else if (!strcmp(op, "truncate"))
		rc = nfs_truncate(nfs, a, strtoull(b, NULL, 10));
	else if (!strcmp(op, "mkfifo"))
		rc = nfs_mknod(nfs, a, S_IFIFO | 0644, 0);
	else if (!strcmp(op, "readlink")) {
		char buf[4096];
		rc = nfs_readlink(nfs, a, buf, sizeof(buf));
		if (!rc)
			printf("%s\n", buf);
	} else if (!strcmp(op, "stat")) {
		struct nfs_stat_64 st;
		rc = nfs_stat64(nfs, a, &st);
		if (!rc) {
			const char *t = S_ISREG(st.nfs_mode) ? "reg" : S_ISDIR(st.nfs_mode) ? "dir" :
					S_ISLNK(st.nfs_mode) ? "lnk" : S_ISFIFO(st.nfs_mode) ? "fifo" : "other";
			printf("size=%llu mode=%llo nlink=%llu type=%s\n",
			       (unsigned long long)st.nfs_size,
			       (unsigned long long)(st.nfs_mode & 07777),
			       (unsigned long long)st.nfs_nlink, t);
		}
	} else {
		fprintf(stderr, "nfsops: unknown op %s\n", op);
		return 2;
	}
	if (rc)
		return fail(nfs, op, rc);
	nfs_destroy_url(url);
	nfs_destroy_context(nfs);
	return 0;
}
